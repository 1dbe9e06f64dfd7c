"""What every route needs (settings, config, broker, metrics), kept on `app.state.api`.

The API holds no state of its own beyond connections: everything lives in Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from redis import asyncio as aredis

from api.metrics import ApiMetrics
from broker.client import Broker
from broker.config import Config, Settings

_ASYNC_KWARGS = ("host", "port", "db", "username", "password", "path")


@dataclass
class ApiState:
    settings: Settings
    config: Config
    broker: Broker
    metrics: ApiMetrics
    _async_redis: aredis.Redis | None = field(default=None, repr=False)

    def async_redis(self) -> aredis.Redis:
        """A redis.asyncio client on the broker's Redis, for blocking reads (SSE)."""
        if self._async_redis is None:
            if self.settings.redis_url:
                self._async_redis = aredis.Redis.from_url(self.settings.redis_url)
            else:
                kwargs: dict[str, Any] = self.broker.redis.connection_pool.connection_kwargs
                picked = {k: kwargs[k] for k in _ASYNC_KWARGS if kwargs.get(k) is not None}
                if "path" in picked:
                    picked["unix_socket_path"] = picked.pop("path")
                self._async_redis = aredis.Redis(**picked)
        return self._async_redis

    async def aclose(self) -> None:
        if self._async_redis is not None:
            await self._async_redis.aclose()
            self._async_redis = None


def get_state(request: Request) -> ApiState:
    """FastAPI dependency: the app's shared state."""
    state: ApiState = request.app.state.api
    return state


State = Annotated[ApiState, Depends(get_state)]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Close the async Redis client on shutdown (the sync one belongs to the broker's owner)."""
    try:
        yield
    finally:
        await app.state.api.aclose()
