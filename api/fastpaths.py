"""The hot routes answered without FastAPI's per-request machinery (issue 18).

A decision over REST (`POST /v1/requests/{id}/decision`) and a signed webhook reply
(`POST /v1/webhooks/{name}/replies`) are what agents wait on. Routed through FastAPI, each pays
for matching every route, solving a dependency graph and validating the body twice over: much
of the API's CPU per decision. Here one ASGI layer answers the ordinary case of those two routes
with the same functions the routes call (the decision service, `broker.auth`'s token check,
`api.webhooks.answer`) and the same error mapping (`api.errors`). Anything out of the ordinary (an id or body that doesn't validate, no or a bad
token, another content type) is handed on untouched, body included, to the FastAPI route, so
its 401s and 422s stay the route's own and /openapi.json still describes what answers.

It sits inside `BodyLimit` (the 1 MiB cap is checked first) and never answers a request the
route would refuse.
"""

from __future__ import annotations

import re

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import webhooks
from api.errors import known_error_response
from api.schemas import DecisionBody
from api.state import ApiState
from broker.auth import Principal, authenticate
from broker.deciding import INBOX

DECISION = re.compile(r"/v1/requests/([A-Za-z0-9_.-]{1,200})/decision")
REPLY = re.compile(r"/v1/webhooks/([A-Za-z0-9_.:-]{1,200})/replies")


class FastPaths:
    """Answer the decision and webhook-reply routes' ordinary requests; pass on the rest."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        decision = DECISION.fullmatch(path)
        reply = None if decision else REPLY.fullmatch(path)
        if decision is None and reply is None:
            await self.app(scope, receive, send)
            return
        body, messages = await _read_body(receive)
        state: ApiState = scope["app"].state.api
        try:
            # the decision service is sync (a Redis read and one atomic step): in the thread
            # pool, so one slow round trip never stalls the loop (README, "Benchmarks")
            if decision is not None:
                response = await run_in_threadpool(_decide, state, scope, decision.group(1), body)
            else:
                assert reply is not None
                response = await run_in_threadpool(_reply, state, scope, reply.group(1), body)
        except Exception as exc:  # noqa: BLE001 - mapped exactly as the router's handlers do
            answer = known_error_response(exc)
            if answer is None:
                raise
            response = answer
        if response is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        await response(scope, receive, send)


def _decide(state: ApiState, scope: Scope, request_id: str, body: bytes) -> JSONResponse | None:
    """The decision route's answer, or None for anything the route itself must judge."""
    if not _is_json(scope):
        return None
    principal = _principal(state, scope)
    if principal is None:
        return None
    try:
        given = DecisionBody.model_validate_json(body)
    except (ValidationError, ValueError):
        return None
    if given.remember is not None:  # a decision that keeps a rule: the route's (api/rules.py)
        return None
    request = state.decide(request_id, given.to_decision(), principal, channel="rest", via=(INBOX,))
    return JSONResponse(request.public())


def _reply(state: ApiState, scope: Scope, name: str, body: bytes) -> JSONResponse:
    """The webhook route's answer (it reads the body raw and raises only ApiError itself)."""
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
    return JSONResponse(webhooks.answer(state, name, body, headers).public())


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
    """The whole body (BodyLimit has capped it), and the messages to replay it from."""
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
