"""`/mcp`: the API as a Model Context Protocol server (Streamable HTTP), for agents in any
language and MCP clients (desktop apps, IDEs, agent SDKs) to ask people for approval.

The official `mcp` SDK speaks the protocol (its low-level `Server` and
`StreamableHTTPSessionManager`, stateless and with JSON answers, so any API process can
answer any call). This module authenticates (the REST bearer tokens, 401 without one) and
turns each tool call into a call of `api.mcp_tools`, whose errors come back as MCP tool errors
(`isError`) carrying the same `{"error", "detail"}` body REST answers with (`api.errors`).
A POST body is checked within bounds before the SDK reads it (`api.mcp_bounds`), and a
principal holds at most as many `GET /mcp` streams here as `/v1/events` streams (429 beyond).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from api.errors import error_response, known_error_response, unauthorized
from api.events import StreamSlots
from api.mcp_bounds import checked_body
from api.mcp_tools import TOOLS, McpTools
from api.state import ApiState
from broker.domain.principals import Principal, authenticate

log = logging.getLogger("approval_broker.api.mcp")

PATH = "/mcp"


def _principal(state: ApiState, authorization: str | None) -> Principal | None:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return authenticate(state.config, token.strip(), state.settings.admin_token)


def _result(body: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    """Structured content and the same as JSON text (for clients that read text only)."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body))],
        structuredContent=body,
        isError=error,
    )


def _error_body(exc: Exception) -> dict[str, Any]:
    """REST's body for this error (`api.errors`, the one mapping); internal errors say no more."""
    response = known_error_response(exc)
    if response is None:
        log.error("unhandled %s in an MCP tool", type(exc).__name__, exc_info=exc)
        return {"error": "internal", "detail": "internal error"}
    return json.loads(bytes(response.body))


def build_server() -> Server[Any, Any]:
    """The MCP server: the tools of `api.mcp_tools`, each call on the caller's HTTP request."""
    server: Server[Any, Any] = Server("approval-broker", version=version("approval-broker"))

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return TOOLS

    @server.call_tool(validate_input=False)  # checked by the REST models, REST's errors
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        http = server.request_context.request
        assert isinstance(http, HttpRequest)
        state: ApiState = http.app.state.api
        principal = _principal(state, http.headers.get("authorization"))
        try:
            if principal is None:  # the endpoint refused it already; never act unauthenticated
                raise unauthorized()
            request = await McpTools(state, http, principal).call(name, arguments)
        except Exception as exc:  # every failure is a tool error with REST's body
            return _result(_error_body(exc), error=True)
        return _result(request.public())

    return server


class McpEndpoint:
    """The ASGI endpoint at `/mcp`: 401 without a valid token, else the session manager of the
    app's lifespan (503 outside it). A POST's body is checked first (`api.mcp_bounds`); a GET
    (a stream the server may send on, open until the client leaves) holds one of the
    principal's stream slots while it is open: as many as `/v1/events` allows
    (`EventsSettings.max_streams_per_principal`), counted apart from those."""

    def __init__(self, slots: StreamSlots) -> None:
        self.manager: StreamableHTTPSessionManager | None = None
        self.slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        http = HttpRequest(scope, receive)
        state: ApiState = http.app.state.api
        principal = _principal(state, http.headers.get("authorization"))
        if principal is None:
            exc = unauthorized()
            response = error_response(401, exc.code, exc.detail, exc.headers)
        elif self.manager is None:
            response = error_response(503, "unavailable", "the MCP endpoint is not running")
        elif scope["method"] == "GET":
            await self._stream(principal, scope, receive, send)
            return
        else:
            checked = await checked_body(scope, receive, send)
            if checked is not None:
                await self.manager.handle_request(scope, checked, send)
            return
        await response(scope, receive, send)

    async def _stream(
        self, principal: Principal, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A GET stream, in one of the principal's slots for as long as it is open; else 429."""
        manager = self.manager
        assert manager is not None
        if not self.slots.acquire(principal.name):
            response = error_response(
                429,
                "too_many_streams",
                f"{principal.name!r} already has {self.slots.limit} MCP streams open here",
                {"Retry-After": "5"},
            )
            await response(scope, receive, send)
            return
        try:
            await manager.handle_request(scope, receive, send)
        finally:
            self.slots.release(principal.name)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """A session manager for one lifespan of the app (a manager runs once)."""
        manager = StreamableHTTPSessionManager(
            app=build_server(), json_response=True, stateless=True
        )
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None


def install_mcp(app: FastAPI) -> McpEndpoint:
    """Route `/mcp` to the MCP endpoint; the app's lifespan runs `endpoint.running()`.

    After `app.state.events` is set: the endpoint's stream cap is the event streams'."""
    endpoint = McpEndpoint(StreamSlots(app.state.events.max_streams_per_principal))
    app.add_route(PATH, endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)  # type: ignore[arg-type]  # an ASGI app: Route serves one as is; the hint names handlers only
    return endpoint
