"""REST: create, list, read and decide requests (`/v1/requests`)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Body, Path, Query
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api.auth import Caller, Requester
from api.idempotency import IdempotencyKey, create_request_once
from api.schemas import ERRORS, ConflictBody, DecisionBody, NewRequestBody
from api.state import ApiState, State
from api.visibility import seer, sees_all, sees_own_only
from api.waits import LongPoll
from broker.domain.errors import Forbidden, InvalidInput, NotFound
from broker.domain.models import Request, Status
from broker.domain.principals import Principal, nobody_decides
from broker.judge import INBOX

router = APIRouter(prefix="/v1/requests", tags=["requests"])
JSON = "application/json"

ID_PATTERN = r"^[A-Za-z0-9_.-]+$"
RequestId = Annotated[
    str, Path(min_length=1, max_length=200, pattern=ID_PATTERN, description="the request id")
]


@router.post(
    "",
    status_code=201,
    response_model=None,
    responses={
        201: {"model": Request, "description": "the request, pending (or decided by a rule)"},
        200: {"model": Request, "description": "an Idempotency-Key repeat: the original"},
        **ERRORS,
    },
)
async def create_request(
    body: NewRequestBody,
    principal: Requester,
    state: State,
    idempotency_key: IdempotencyKey = None,
) -> JSONResponse:
    """Create a request (agents that aren't Python). Needs the `requester` role.

    `allowed_roles` must let someone decide: a configured approver, or a deciding webhook
    endpoint the queue lists, holding one of them and one of the queue's roles (a role held by
    nobody, or only by `requester`/`auditor` principals, would leave it for the admin alone).

    In the thread pool: the create checks the request's schemas (`answer_schema`,
    `args_schema`: bounded in size, depth and work, see `broker.domain.schema_safety`) and calls
    Redis, neither of which may hold the event loop; with an Idempotency-Key a concurrent
    create with the same key polls for the winner's id there too.
    """
    body = checked_new_request(state, principal, body)
    if idempotency_key is not None:
        return await run_in_threadpool(create_request_once, state, principal, idempotency_key, body)
    request = await run_in_threadpool(state.broker.create_request, body)
    return JSONResponse(request.public(), status_code=201)


def checked_new_request(
    state: ApiState, principal: Principal, body: NewRequestBody
) -> NewRequestBody:
    """The body to create as `principal` (its `created_by`), once someone configured may
    decide it (`broker.domain.principals.nobody_decides`): what every way in (REST, `/mcp`)
    creates, so the checks can't differ."""
    config = state.config
    unknown = sorted(set(body.allowed_roles) - config.known_roles())
    if unknown:
        raise InvalidInput(
            f"allowed_roles: no approver or webhook endpoint has the role(s) {', '.join(unknown)}",
            code="unknown_role",
        )
    if body.queue in config.queues and nobody_decides(config, body.queue, body.allowed_roles):
        needs = ", ".join(config.queue_roles(body.queue))
        raise InvalidInput(
            f"allowed_roles: nobody who may decide in queue {body.queue!r} has the role(s)"
            f" {', '.join(body.allowed_roles)}"
            + (f" together with one of the queue's roles ({needs})" if needs else "")
            + " ('requester' and 'auditor' decide nothing; notify-only endpoints neither)",
            code="unknown_role",
        )
    return body.model_copy(update={"created_by": principal.name})


def visible_request(state: ApiState, principal: Principal, request_id: str) -> Request:
    """The request if `principal` may see it; NotFound otherwise, as for an unknown id."""
    request = state.broker.get_request(request_id)
    if not seer(principal, state.config)(request):
        raise NotFound(f"no request with id {request_id!r}")
    return request


@router.get(
    "",
    response_model=None,
    responses={
        200: {
            "model": list[Request],
            "description": "one page, newest first (pending: soonest to expire first); the next"
            ' page is in the `Link: <...>; rel="next"` and `X-Next-Cursor` headers',
            "headers": {
                "Link": {
                    "description": 'the next page: `<URL>; rel="next"` (absent: no more)',
                    "schema": {"type": "string"},
                },
                "X-Next-Cursor": {
                    "description": "the next page's `cursor` (absent: no more)",
                    "schema": {"type": "string"},
                },
            },
        },
        **ERRORS,
    },
)
def list_requests(
    principal: Caller,
    state: State,
    http: HttpRequest,
    status: Status | None = None,
    queue: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    run_id: Annotated[str | None, Query(min_length=1, max_length=200, pattern=ID_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[
        str | None, Query(min_length=1, max_length=1000, description="from a `Link: rel=next`")
    ] = None,
) -> JSONResponse:
    """Requests the caller may see, one page at a time, filtered.

    A requester-only token lists what it created; an auditor and the admin everything; an
    approver what it may decide (and what it created).
    """
    page = state.broker.requests.list_page(
        status=status,
        queue=queue,
        run_id=run_id,
        created_by=principal.name if sees_own_only(principal) else None,
        limit=limit,
        cursor=cursor,
        keep=None if sees_all(principal) else seer(principal, state.config),
    )
    response = JSONResponse([r.public() for r in page.items])
    if page.next_cursor:
        params = [(k, v) for k, v in http.query_params.multi_items() if k != "cursor"]
        url = f"{http.url.path}?{urlencode([*params, ('cursor', page.next_cursor)])}"
        response.headers["Link"] = f'<{url}>; rel="next"'
        response.headers["X-Next-Cursor"] = page.next_cursor
    return response


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
    """One request, with its status, decision and history (404 for one the caller may not
    see, as for an unknown id)."""
    return JSONResponse(visible_request(state, principal, request_id).public())


@router.post(
    "/{request_id}/decision",
    response_model=None,
    responses={
        200: {"model": Request, "description": "decided (or escalated): the request as recorded"},
        409: {"model": ConflictBody, "description": "already decided or timed out"},
        **ERRORS,
    },
)
async def decide(
    request_id: RequestId,
    body: Annotated[DecisionBody, Body()],
    decider: Caller,
    state: State,
) -> Response:
    """Decide a pending request; the first decision wins, a repeat of it is not an error.

    A bearer token decides through the `inbox` channel: only requests whose queue lists
    `inbox` (the admin token: any request). With `remember`, the policy rule is kept in the
    same step (see /v1/rules). The judge runs on the event loop (its reads and the step on
    redis.asyncio); what must not (checks against a schema, a rule to remember) it runs in a
    thread itself (`broker.judge.Judge.adecide`).
    """
    try:
        done = await state.judge.adecide(
            request_id, body.to_decision(), decider, via=(INBOX,), remember=body.remember
        )
    except Forbidden as exc:  # rare: one read more, in a thread
        raise await run_in_threadpool(unseen_as_missing, state, decider, request_id, exc) from None
    # pydantic writes the JSON (what `public()` then the stdlib's encoder wrote, in one pass)
    return Response(done.request.model_dump_json(), media_type=JSON)


def unseen_as_missing(
    state: ApiState, decider: Principal, request_id: str, refusal: Forbidden
) -> Exception:
    """What to answer a refused decision or ack with: 404 `not_found` for a request the caller
    may not see, exactly as GET answers (it must not learn the request exists); else the
    refusal (403: it may see the request, not decide it). A refusal is rare: one read more."""
    visible_request(state, decider, request_id)  # raises NotFound
    return refusal
