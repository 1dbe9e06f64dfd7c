"""The FastAPI app: HTTP API v1 (docs/architecture.md), one router per module.

`create_app` is what the server, the tests and `up` call; other features (the inbox page) add
their router the same way, listed in ROUTERS. The OpenAPI document is corrected and /docs
served locally by api.openapi.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from api import (
    audit,
    discord,
    email,
    events,
    health,
    inbox,
    metrics,
    receipts,
    requests,
    rules,
    runs,
    slack,
    teams,
    telegram,
    webhooks,
)
from api.acks import router as acks_router
from api.errors import install_error_handlers
from api.events import EventsSettings, StreamSlots
from api.headers import EmailPageHeaders
from api.limits import BodyLimit
from api.mcp import install_mcp
from api.metrics import ApiMetrics
from api.openapi import install_openapi
from api.state import ApiState, lifespan
from api.waits import router as waits_router
from broker.domain.config import Config, Settings
from broker.facade import Broker

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    waits_router,
    requests.router,
    acks_router,
    runs.router,
    slack.router,
    teams.router,
    telegram.router,
    discord.router,
    email.router,
    webhooks.router,
    events.router,
    metrics.router,
    inbox.router,
    rules.router,
    receipts.router,
    audit.router,
)


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
    )
    app.state.api = ApiState(settings, config, broker, ApiMetrics(broker))
    app.state.events = events_settings or EventsSettings.from_env()
    app.state.event_slots = StreamSlots(app.state.events.max_streams_per_principal)
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    app.add_middleware(EmailPageHeaders)
    for router in ROUTERS:
        app.include_router(router)
    app.state.mcp = install_mcp(app)
    install_openapi(app)
    return app
