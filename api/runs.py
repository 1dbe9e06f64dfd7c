"""Starting registered agents on the fleet and following their runs (`/v1/runs`).

An unknown agent is a 422 (`unknown_agent`): the path exists, the body names nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.auth import Caller, Requester
from api.errors import ApiError
from api.follow import waiter_for
from api.idempotency import IdempotencyKey, start_run_once
from api.requests import ID_PATTERN
from api.schemas import ERRORS, ErrorBody, RunStart, RunStarted
from api.state import ApiState, State
from api.visibility import may_see_run
from api.waits import MAX_WAIT_S
from broker.domain.errors import Conflict, Forbidden, NotFound
from broker.domain.models import Run, RunStatus
from broker.domain.principals import EVERY_ROLE
from broker.runs.new_prompt import continue_with_prompt
from broker.runs.starting import FINAL, start_run

router = APIRouter(prefix="/v1/runs", tags=["runs"])
RunId = Annotated[str, Path(min_length=1, max_length=200, pattern=ID_PATTERN)]


class NewPrompt(BaseModel):
    """POST /v1/runs/{run_id}/messages: what the user said instead of answering."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=100_000)


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
    run = start_run(state.broker, body.agent, body.prompt, started_by=principal.name)
    return JSONResponse({"run_id": run.id}, status_code=202)


@router.get(
    "/{run_id}",
    response_model=None,
    responses={200: {"model": Run, "description": "the run"}, **ERRORS},
)
async def get_run(
    run_id: RunId,
    principal: Caller,
    state: State,
    http: HttpRequest,
    wait: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_WAIT_S,
            description="long-poll: answer once the run needs a person (waiting with pending "
            "requests) or has ended, or after this many seconds (at most 60)",
        ),
    ] = None,
) -> JSONResponse:
    """A run: status, round, pending request ids, output. Only its starter, an auditor and
    the admin see it (`api.visibility.may_see_run`); others get 404, at once, with or without
    `?wait=`. A long-poll reads the run once the stream reader's positions are fixed, so that
    one read is both the answer for a run that is settled already and where the wait starts."""
    if wait is None:
        starter, run = await read_run(state, run_id)
    else:
        read: list[tuple[str | None, Run]] = []

        async def ready() -> bool:
            read[:] = [await read_run(state, run_id)]
            return settled(read[0][1]) or not may_see_run(principal, read[0][0])

        await waiter_for(http, state).watch([run_id], wait, ready)  # reads at least once
        starter, run = read[0]
    if not may_see_run(principal, starter):
        raise NotFound(f"no run with id {run_id!r}")
    return JSONResponse(run.public())


async def read_run(state: ApiState, run_id: str) -> tuple[str | None, Run]:
    """Who started the run, and the run: its hash and pending set in one round trip on the
    API's asyncio reads (no thread hop; their timeouts turn a stalled Redis into a 503)."""
    run, starter = await state.reads().run(run_id)
    return starter, run


def settled(run: Run) -> bool:
    """What a long-poll on a run waits for: it ended, or it waits for a person. A `waiting`
    run whose calls are all answered is about to resume, so it is not settled yet."""
    return run.status in FINAL or (run.status == RunStatus.waiting and bool(run.pending))


@router.post(
    "/{run_id}/messages",
    status_code=202,
    response_model=None,
    responses={
        202: {"model": Run, "description": "the waiting calls were rejected; the run resumes"},
        409: {"model": ErrorBody, "description": "not waiting, or the agent must be answered"},
        **ERRORS,
    },
)
def post_message(
    run_id: RunId,
    body: NewPrompt,
    principal: Requester,
    state: State,
) -> JSONResponse:
    """A new prompt instead of answers: each waiting call is rejected with "The user did not
    answer" (decided by the caller) and the run goes on with the prompt. Only the run's starter
    (and the admin) may: others get 404, an auditor (who sees it) 403."""
    started_by = state.broker.run_fields(run_id).get("started_by")
    if not may_see_run(principal, started_by):
        raise NotFound(f"no run with id {run_id!r}")
    if started_by != principal.name and EVERY_ROLE not in principal.roles:
        raise Forbidden(f"{principal.name!r} did not start run {run_id}, so may not answer it")
    try:
        run = continue_with_prompt(state.broker, run_id, body.prompt, by=principal.name)
    except Conflict as exc:
        raise ApiError(409, exc.code, exc.detail) from None
    return JSONResponse(run.public(), status_code=202)
