"""What every route needs (settings, config, broker, metrics, the judge), kept on
`app.state.api`; it is also the channels' `InboundHost`.

The API holds no state of its own beyond connections: everything lives in Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from api.metrics import ApiMetrics
from api.redis_async import AsyncRedis, async_client
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.judge import INBOX, Decided, Judge


@dataclass
class ApiState:
    settings: Settings
    config: Config
    broker: Broker
    metrics: ApiMetrics
    _async_redis: AsyncRedis | None = field(default=None, repr=False)
    judge: Judge = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.judge = Judge(
            self.broker, self.config, observe=self.count_decision, async_redis=self.async_redis
        )

    def count_decision(self, done: Decided) -> None:
        """The judge's observer: a recorded decision in the latency histogram, under the kind
        of channel it came through (`rest` for a bearer token's `inbox`); a vote below the
        quorum and an escalation decide nothing yet."""
        if done.request.decision is None:
            return
        kind = "rest" if done.channel == INBOX else done.channel.partition(":")[0]
        self.metrics.observe_decision(done.request, kind)

    def async_redis(self) -> AsyncRedis:
        """An asyncio client on the broker's Redis (or Redis Cluster), for blocking reads (SSE)."""
        if self._async_redis is None:
            self._async_redis = async_client(self.settings, self.broker)
        return self._async_redis

    async def aclose(self) -> None:
        if self._async_redis is not None:
            await self._async_redis.aclose()
            self._async_redis = None


async def get_state(request: Request) -> ApiState:
    """FastAPI dependency: the app's shared state (async: a sync one would cost a thread hop)."""
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
