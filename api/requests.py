"""REST: create, list, read and decide requests (`/v1/requests`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import JSONResponse

from api.auth import Caller, Requester
from api.idempotency import IdempotencyKey, create_request_once
from api.schemas import ERRORS, ConflictBody, DecisionBody, NewRequestBody
from api.state import State
from api.waits import LongPoll
from broker.deciding import INBOX
from broker.errors import InvalidInput
from broker.models import Request, Status

router = APIRouter(prefix="/v1/requests", tags=["requests"])

ID_PATTERN = r"^[A-Za-z0-9_.-]+$"
RequestId = Annotated[
    str, Path(min_length=1, max_length=200, pattern=ID_PATTERN, description="the request id")
]


@router.post(
    "",
    status_code=201,
    response_model=None,
    responses={201: {"model": Request, "description": "the request, pending"}, **ERRORS},
)
def create_request(
    body: NewRequestBody,
    principal: Requester,
    state: State,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Create a request (agents that aren't Python). Needs the `requester` role.

    `allowed_roles` may name only roles that some approver or webhook endpoint holds: a role
    nobody has would leave the request for the admin alone.
    """
    unknown = sorted(set(body.allowed_roles) - state.config.known_roles())
    if unknown:
        raise InvalidInput(
            f"allowed_roles: no approver or webhook endpoint has the role(s) {', '.join(unknown)}",
            code="unknown_role",
        )
    if idempotency_key is not None:
        return create_request_once(state, principal, idempotency_key, body)
    request = state.broker.create_request(body)
    state.broker.redis.hset(state.broker.keys.request(request.id), "created_by", principal.name)
    request = request.model_copy(update={"created_by": principal.name})  # for api.visibility
    return JSONResponse(request.public(), status_code=201)


@router.get(
    "",
    response_model=None,
    responses={200: {"model": list[Request], "description": "newest first"}, **ERRORS},
)
def list_requests(
    principal: Caller,
    state: State,
    status: Status | None = None,
    queue: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    """Requests, newest first (pending ones: soonest to expire first), filtered."""
    requests = state.broker.list_requests(status=status, queue=queue, limit=limit)
    return JSONResponse([r.public() for r in requests])


@router.get(
    "/{request_id}",
    response_model=None,
    responses={200: {"model": Request, "description": "the request"}, **ERRORS},
)
def get_request(
    request_id: RequestId,
    principal: Caller,
    state: State,
    waited: LongPoll,
) -> JSONResponse:
    """One request, with its status, decision and history."""
    return JSONResponse(state.broker.get_request(request_id).public())


@router.post(
    "/{request_id}/decision",
    response_model=None,
    responses={
        200: {"model": Request, "description": "decided (or escalated): the request as recorded"},
        409: {"model": ConflictBody, "description": "already decided or timed out"},
        **ERRORS,
    },
)
def decide(
    request_id: RequestId,
    body: Annotated[DecisionBody, Body()],
    principal: Caller,
    state: State,
) -> JSONResponse:
    """Decide a pending request; the first decision wins, a repeat of it is not an error.

    A bearer token decides through the `inbox` channel: only requests whose queue lists
    `inbox` (the admin token: any request).
    """
    request = state.decide(request_id, body.to_decision(), principal, channel="rest", via=(INBOX,))
    return JSONResponse(request.public())
