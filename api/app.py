"""The FastAPI app: HTTP API v1 (DESIGN.md), one router per module.

`create_app` is what the server, the tests and `up` call; other features (the inbox page) add
their router the same way, listed in ROUTERS.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from api import email, events, health, inbox, metrics, requests, runs, slack, webhooks
from api.acks import router as acks_router
from api.errors import install_error_handlers
from api.limits import BodyLimit
from api.metrics import ApiMetrics
from api.state import ApiState, lifespan
from broker.client import Broker
from broker.config import Config, Settings

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    requests.router,
    acks_router,
    runs.router,
    slack.router,
    email.router,
    webhooks.router,
    events.router,
    metrics.router,
    inbox.router,
)


def create_app(settings: Settings, config: Config, broker: Broker | None = None) -> FastAPI:
    """Build the app on `broker` (default: a Broker on settings.redis_url)."""
    broker = broker or Broker.from_settings(settings, config)
    app = FastAPI(
        title="approval-broker",
        version="1",
        summary="Replies to AI agents' approval requests: REST, Slack, email links, webhooks.",
        lifespan=lifespan,
    )
    app.state.api = ApiState(settings, config, broker, ApiMetrics(broker))
    install_error_handlers(app)
    app.add_middleware(BodyLimit)
    for router in ROUTERS:
        app.include_router(router)
    return app
