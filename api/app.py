"""The FastAPI app: HTTP API v1 (docs/internals.md), one router per module.

`create_app` is what the server, the tests and `up` call. The API's own routers are listed in
ROUTERS; each configured channel kind mounts its inbound routes from its plugin. The OpenAPI document is corrected and /docs
served locally by api.openapi.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.telemetry import TelemetryConfig

from api import audit, events, health, metrics, queues, receipts, requests, rules, runs, stats
from api.acks import router as acks_router
from api.errors import install_error_handlers
from api.events import EventsSettings, StreamSlots
from api.limits import BodyLimit
from api.mcp import install_mcp
from api.metrics import ApiMetrics
from api.openapi import install_openapi
from api.schemas import ERRORS
from api.state import ApiState, lifespan
from api.waits import router as waits_router
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.tracing import telemetry as tracing
from channels import configured, plugins
from channels.errors import not_configured
from channels.inbound import HOST_ATTR
from channels.plugin import ChannelPlugin

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    waits_router,
    requests.router,
    acks_router,
    runs.router,
    queues.router,
    events.router,
    metrics.router,
    rules.router,
    receipts.router,
    audit.router,
    stats.router,
)


def fastapi_telemetry() -> TelemetryConfig:
    """FastAPI's native OpenTelemetry: on when the `OTEL_*` environment asks for traces (its
    `POST /v1/runs` server spans are the roots of a traced fleet's traces), else off.

    Left at FastAPI's default it asks OpenTelemetry for the global tracer, meter and logger
    providers on every request to learn that none is set (environment lookups each time): 2-4 %
    of the API's CPU in `bench/bench_e2e.py` and `bench/bench_agents.py` profiles, for nothing
    when nobody traces."""
    on = tracing.wanted()
    return {"tracing": on, "metrics": on, "logs": on}


def not_configured_router(kind: ChannelPlugin) -> APIRouter:
    """Routes under an unconfigured kind's prefix: `404 not_configured`, its code unloaded."""
    assert kind.route_prefix is not None
    router = APIRouter(prefix=kind.route_prefix, include_in_schema=False)

    @router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unconfigured(rest: str) -> None:
        raise not_configured(kind.kind.capitalize())

    return router


def install_channels(app: FastAPI, config: Config) -> None:
    """Mount each configured channel kind's inbound routes (`channels.plugin`), and answer
    the others' prefixes with `404 not_configured`."""
    used = configured(config)
    for kind in plugins():
        if kind in used:
            router = kind.routes()
            if router is not None:
                app.include_router(router, responses=ERRORS)
            for middleware in kind.middleware():
                app.add_middleware(middleware)
        elif kind.route_prefix is not None:
            app.include_router(not_configured_router(kind))


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The state's lifespan and `/mcp`'s sessions, then the stream reader closed."""
    async with lifespan(app), app.state.mcp.running():
        try:
            url = getattr(app.state, "listening_url", None)
            if url:  # api.server's socket listens already: connections queue until we serve
                print(f"API listening on {url}", flush=True)
            yield
        finally:
            waiter = getattr(app.state, "waiter", None)
            if waiter is not None and waiter.loop is asyncio.get_running_loop():
                app.state.waiter = None
                await waiter.aclose()


def create_app(
    settings: Settings,
    config: Config,
    broker: Broker | None = None,
    *,
    events_settings: EventsSettings | None = None,
) -> FastAPI:
    """Build the app on `broker` (default: a Broker on settings.redis_url)."""
    broker = broker or Broker.from_settings(settings, config)
    app = FastAPI(
        title="approval-broker",
        version="1",
        summary="Replies to AI agents' approval requests: REST, Slack, email links, webhooks.",
        lifespan=_lifespan,
        docs_url=None,  # api.openapi serves /docs from local files; ReDoc needs a CDN
        redoc_url=None,
        telemetry=fastapi_telemetry(),
    )
    app.state.api = ApiState(settings, config, broker, ApiMetrics(broker))
    setattr(app.state, HOST_ATTR, app.state.api)  # what the channels' routes are handed
    app.state.events = events_settings or EventsSettings.from_env()
    app.state.event_slots = StreamSlots(app.state.events.max_streams_per_principal)
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    # the channels' routes first: routes are matched in order, and a channel's replies (a
    # webhook's signed decisions) are the busiest; after BodyLimit: a kind's middleware wraps it
    install_channels(app, config)
    for router in ROUTERS:
        app.include_router(router)
    app.state.mcp = install_mcp(app)
    install_openapi(app)
    return app
