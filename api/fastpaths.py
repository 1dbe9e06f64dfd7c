"""The hot routes answered without FastAPI's per-request machinery (issue 18).

A decision over REST (`POST /v1/requests/{id}/decision`) and a signed webhook reply
(`POST /v1/webhooks/{name}/replies`) are what agents wait on. Routed through FastAPI, each pays
for matching every route, solving a dependency graph and validating the body twice over: much
of the API's CPU per decision. Here one ASGI layer answers the ordinary case of those two routes
with the same functions the routes call (the decision service, `broker.auth`'s token check,
`api.webhooks.answer`) and the same error mapping (`api.errors`). Anything out of the ordinary (an id or body that doesn't validate, no or a bad
token, another content type) is handed on untouched, body included, to the FastAPI route, so
its 401s and 422s stay the route's own and /openapi.json still describes what answers.

It is called from `api.hotfront.HotFront`, in front of every ASGI layer: the front hands it only
a request whose declared Content-Length is within the 1 MiB cap (a chunked or larger one goes
through the stack, where `BodyLimit` answers 413), and it never answers a request the route
would refuse.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import webhooks
from api.errors import known_error_response
from api.requests import decide_rest
from api.schemas import DecisionBody
from api.state import ApiState
from broker.auth import Principal, authenticate
from broker.client import Once
from broker.deciding import INBOX
from broker.deciding_async import AsyncDeciding
from broker.models import Decision
from broker.models import Request as BrokerRequest

DECISION = re.compile(r"/v1/requests/([A-Za-z0-9_.-]{1,200})/decision")
REPLY = re.compile(r"/v1/webhooks/([A-Za-z0-9_.:-]{1,200})/replies")


DECLINED = "approval_broker.declined"
"""Set in the scope of a request the fast path handed on (`api.hotfront` asks first, so the
`FastPaths` layer inside the app must not judge it again)."""
ANSWERING = "approval_broker.answering"
"""Set in the scope once the fast path's own answer is being sent (after this, an error is
not answered again)."""


class FastPaths:
    """Answer the decision and webhook-reply routes' ordinary requests; pass on the rest."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or DECLINED in scope
            or not await serve(scope["app"], scope, receive, send, self.app)
        ):
            await self.app(scope, receive, send)


async def serve(app: Any, scope: Scope, receive: Receive, send: Send, inner: ASGIApp) -> bool:
    """Answer a POST to a hot route of `app` (the FastAPI app), or hand it to `inner` with its
    body; False (nothing read) for any other path."""
    path: str = scope["path"]
    decision = DECISION.fullmatch(path)
    reply = None if decision else REPLY.fullmatch(path)
    if decision is None and reply is None:
        return False
    body, messages = await _read_body(receive)
    try:
        if decision is not None:
            response = await _decide(app.state.api, app.state.hot, scope, decision.group(1), body)
        else:
            assert reply is not None
            response = await _reply(app.state.api, app.state.hot, scope, reply.group(1), body)
    except Exception as exc:  # noqa: BLE001 - mapped exactly as the router's handlers do
        answer = known_error_response(exc)
        if answer is None:
            raise
        response = answer
    if response is None:
        scope[DECLINED] = True
        await inner(scope, _replay(messages, receive), send)
        return True
    scope[ANSWERING] = True
    await response(scope, receive, send)
    return True


async def decide(
    state: ApiState,
    hot: AsyncDeciding,
    request_id: str,
    decision: Decision,
    principal: Principal,
    *,
    channel: str,
    via: tuple[str, ...],
    decided_by: str | None = None,
    once: Once | None = None,
) -> tuple[BrokerRequest | None, BrokerRequest | None]:
    """One awaited step for an ordinary decision, counted in the metrics as `channel` (as
    `ApiState.decide` counts); (None, the request the step saw) when the service must judge."""
    done, seen = await hot.decide(
        request_id, decision, principal, via=via, decided_by=decided_by, once=once
    )
    if done is None:
        return None, seen
    if done.recorded:
        state.metrics.observe_decision(done.request, channel)
    return done.request, None


async def _decide(
    state: ApiState, hot: AsyncDeciding, scope: Scope, request_id: str, body: bytes
) -> ASGIApp | None:
    """The decision route's answer, or None for anything the route itself must judge."""
    if not _is_json(scope):
        return None
    principal = _principal(state, scope)
    if principal is None:
        return None
    decision = _decision_of(body)
    if decision is None:
        return None
    request, seen = await decide(
        state, hot, request_id, decision, principal, channel="rest", via=(INBOX,)
    )
    if request is None:  # the full service judges (a thread: it may read, then step)
        request = await run_in_threadpool(decide_rest, state, request_id, decision, principal, seen)
    return _json(request)


async def _reply(
    state: ApiState, hot: AsyncDeciding, scope: Scope, name: str, body: bytes
) -> ASGIApp:
    """The webhook route's answer (it reads the body raw and raises only ApiError itself)."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}.items()
    if webhooks.verify_on_loop(state, name, body):
        given = webhooks.prepare(state, name, body, headers)
    else:  # a large body, an HMAC per secret: a thread's work, the loop serves the rest meanwhile
        given = await run_in_threadpool(webhooks.prepare, state, name, body, headers)
    request, seen = None, None
    if given.reply.remember is None:
        request, seen = await decide(
            state,
            hot,
            given.reply.request_id,
            given.reply.to_decision(),
            given.principal,
            channel="webhook",
            via=(given.principal.name,),
            decided_by=given.decided_by,
            once=given.once,
        )
    if request is None:
        request = await run_in_threadpool(webhooks.record, state, given, seen)
    return _json(request)


_BODIES: dict[bytes, Decision] = {}
_BODIES_KEPT = 256
"""Bodies already parsed, by their bytes (most are `{"outcome":"approved"}`, give or take a
reason): parsing and validating one was a tenth of the API's CPU per decision."""


def _decision_of(body: bytes) -> Decision | None:
    """The decision a body holds; None for one the route must judge (invalid, or `remember`)."""
    decision = _BODIES.get(body)
    if decision is not None:
        return decision
    try:
        given = DecisionBody.model_validate_json(body)
    except (ValidationError, ValueError):
        return None
    if given.remember is not None:  # a decision that keeps a rule: the route's (api/rules.py)
        return None
    decision = given.to_decision()
    if len(body) <= 512:
        if len(_BODIES) >= _BODIES_KEPT:
            _BODIES.clear()
        _BODIES[body] = decision
    return decision


class _Json:
    """The request as the routes' JSONResponse writes it (the same two headers, in the same
    order), serialised by pydantic (no dict), without building a Starlette `Response`."""

    __slots__ = ("body",)

    def __init__(self, request: BrokerRequest) -> None:
        self.body = request.model_dump_json().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", b"%d" % len(self.body)), _JSON_TYPE]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


_JSON_TYPE = (b"content-type", b"application/json")


def _json(request: BrokerRequest) -> _Json:
    return _Json(request)


def _is_json(scope: Scope) -> bool:
    for key, value in scope["headers"]:
        if key == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def _principal(state: ApiState, scope: Scope) -> Principal | None:
    """The bearer token's principal, as `api.auth.current_principal` finds it; None otherwise."""
    for key, value in scope["headers"]:
        if key == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer" or not token:
                return None
            return authenticate(state.config, token, state.settings.admin_token)
    return None


async def _read_body(receive: Receive) -> tuple[bytes, list[Message]]:
    """The whole body (within the cap: `HotFront` took only a declared length under it), and
    the messages to replay it from."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks), messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay
