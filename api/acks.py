""" "I'm on it" (`POST /v1/requests/{id}/ack`): the request stays pending, escalation waits.

Anyone who may decide the request may acknowledge it (the judge says so, as for a decision,
through the `inbox` channel of a bearer token). An ack never changes the outcome and
never counts as a vote: it records who and when in the request's history and holds the sweeper
off for the queue's `ack_timeout_s` (default 900 s); after that, escalation resumes.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.auth import Caller
from api.requests import RequestId, unseen_as_missing
from api.schemas import ERRORS, ConflictBody
from api.state import State
from broker.domain.errors import Forbidden
from broker.domain.models import Request
from broker.judge import INBOX

router = APIRouter(prefix="/v1/requests", tags=["requests"])


@router.post(
    "/{request_id}/ack",
    response_model=None,
    responses={
        200: {"model": Request, "description": "acknowledged: still pending, escalation held"},
        409: {"model": ConflictBody, "description": "already decided, timed out or moved"},
        **ERRORS,
    },
)
def ack(request_id: RequestId, decider: Caller, state: State) -> JSONResponse:
    """Say "I'm on it": escalation of the request waits for its queue's `ack_timeout_s`."""
    try:
        request = state.judge.ack(request_id, decider, via=(INBOX,))
    except Forbidden as exc:  # 404 for a request the caller may not see, as GET answers
        raise unseen_as_missing(state, decider, request_id, exc) from None
    return JSONResponse(request.public())
