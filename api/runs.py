"""Starting registered agents on the fleet and following their runs (`/v1/runs`).

An unknown agent is a 422 (`unknown_agent`): the path exists, the body names nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from api.auth import Caller, Requester
from api.idempotency import IdempotencyKey, start_run_once
from api.requests import ID_PATTERN
from api.schemas import ERRORS, RunStart, RunStarted
from api.state import State
from broker.models import Run
from broker.runs import start_run

router = APIRouter(prefix="/v1/runs", tags=["runs"])


@router.post(
    "",
    status_code=202,
    response_model=None,
    responses={202: {"model": RunStarted, "description": "queued on the fleet"}, **ERRORS},
)
def create_run(
    body: RunStart,
    principal: Requester,
    state: State,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Start a registered agent. Needs the `requester` role; `Idempotency-Key` honoured."""
    if idempotency_key is not None:
        return start_run_once(state, principal, idempotency_key, body)
    run = start_run(state.broker, body.agent, body.prompt)
    return JSONResponse({"run_id": run.id}, status_code=202)


@router.get(
    "/{run_id}",
    response_model=None,
    responses={200: {"model": Run, "description": "the run"}, **ERRORS},
)
def get_run(
    run_id: Annotated[str, Path(min_length=1, max_length=200, pattern=ID_PATTERN)],
    principal: Caller,
    state: State,
) -> JSONResponse:
    """A run: status, round, pending request ids, output."""
    return JSONResponse(state.broker.get_run(run_id).public())
