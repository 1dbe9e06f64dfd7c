"""Serve a gateway: on stdio (for desktop MCP clients that start it as a command) or on
Streamable HTTP at `/mcp` (uvicorn, loopback only), until stopped.

The broker is reached through the client package (`AsyncRemoteBroker`) at `broker_url`
(default: the local `up`, `APPROVAL_BROKER_HOST`/`PORT`) with `token` (`env:NAME` allowed).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import uvicorn
from approval_broker_client import AsyncRemoteBroker
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from api.mcp_bounds import checked_body
from broker.domain.config import Config, resolve_secret
from broker.domain.errors import ConfigError
from broker.domain.settings import Settings
from mcp_gateway.gate import Gate
from mcp_gateway.server import Gateway
from mcp_gateway.upstream import Upstream

HTTP_PATH = "/mcp"


def broker_client(name: str, config: Config, settings: Settings) -> AsyncRemoteBroker:
    """The client of the broker's API for gateway `name` (ConfigError if it can't be made)."""
    gateway = config.mcp_gateways.get(name)
    if gateway is None:
        known = ", ".join(sorted(config.mcp_gateways)) or "none"
        raise ConfigError(f"no [mcp_gateways.{name}] in the config (defined: {known})")
    token = resolve_secret(gateway.token, f"mcp_gateways.{name}.token", config.source)
    if not token:
        raise ConfigError(f"mcp_gateways.{name}.token: a token with the role 'requester' is needed")
    url = gateway.broker_url or f"http://{settings.host}:{settings.port}"
    return AsyncRemoteBroker(url, token, timeout=30.0)


@contextlib.asynccontextmanager
async def gateway_for(name: str, config: Config, settings: Settings) -> AsyncIterator[Gateway]:
    """The gateway `name`, its upstream connected on demand, closed on leaving."""
    client = broker_client(name, config, settings)
    spec = config.mcp_gateways[name]
    gate = Gate(client, name, queue=spec.queue, gate=spec.gate, timeout_s=spec.timeout_s)
    upstream = Upstream(spec)
    async with client, anyio.create_task_group() as tasks:
        upstream.start(tasks)
        try:
            yield Gateway(name, upstream, gate)
        finally:
            upstream.drop()


async def serve_stdio(name: str, config: Config, settings: Settings) -> None:
    async with gateway_for(name, config, settings) as gateway:
        server = gateway.server()
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


class _Endpoint:
    """`/mcp`: the SDK's transport, handed only bodies within the API's bounds
    (`api.mcp_bounds`: a body nested thousands deep is a 4xx here, not a 500 in the SDK)."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self.manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        checked = await checked_body(scope, receive, send)
        if checked is not None:
            await self.manager.handle_request(scope, checked, send)


def http_app(gateway: Gateway) -> Starlette:
    """The gateway as an ASGI app: `/mcp` (Streamable HTTP, stateless, JSON answers); its
    lifespan runs the SDK's session manager."""
    manager = StreamableHTTPSessionManager(app=gateway.server(), json_response=True, stateless=True)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return Starlette(
        routes=[Route(HTTP_PATH, _Endpoint(manager), methods=["GET", "POST", "DELETE"])],
        lifespan=lifespan,
    )


async def serve_http(
    name: str, config: Config, settings: Settings, port: int, host: str = "127.0.0.1"
) -> None:
    async with gateway_for(name, config, settings) as gateway:
        server = uvicorn.Server(
            uvicorn.Config(
                http_app(gateway), host=host, port=port, log_level="warning", lifespan="on"
            )
        )
        await server.serve()
