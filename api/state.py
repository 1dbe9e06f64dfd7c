"""What every route needs (settings, config, broker, metrics, the judge), kept on
`app.state.api`; it is also the channels' `InboundHost`.

The API holds no state of its own beyond connections: everything lives in Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request

from api.metrics import ApiMetrics
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import AsyncReads, Broker
from broker.judge import INBOX, Decided, Judge
from broker.runs.direct_resume import DirectResumes


@dataclass
class ApiState:
    settings: Settings
    config: Config
    broker: Broker
    metrics: ApiMetrics
    _reads: AsyncReads | None = field(default=None, repr=False)
    judge: Judge = field(init=False, repr=False)
    resumes: DirectResumes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # a round a decision on the event loop completes is resumed from here at once; the
        # resumers take it only if this process dies first (broker.runs.direct_resume)
        self.resumes = DirectResumes(self.broker)
        self.judge = Judge(
            self.broker,
            self.config,
            observe=self.count_decision,
            async_redis=self.async_client,
            resumes=self.resumes,
        )

    def count_decision(self, done: Decided) -> None:
        """The judge's observer: a recorded decision in the latency histogram, under the kind
        of channel it came through (`rest` for a bearer token's `inbox`); a vote below the
        quorum and an escalation decide nothing yet."""
        if done.request.decision is None:
            return
        kind = "rest" if done.channel == INBOX else done.channel.partition(":")[0]
        self.metrics.observe_decision(done.request, kind)

    def reads(self) -> AsyncReads:
        """The core's asyncio reads on the broker's Redis (or Redis Cluster): event streams,
        runs (`broker.store.async_reads`)."""
        if self._reads is None:
            self._reads = self.broker.async_reads(self.settings.redis_url)
        return self._reads

    def async_client(self) -> Any:
        """The redis.asyncio client under `reads` (the judge's async face runs its steps on it)."""
        return self.reads().client

    async def aclose(self) -> None:
        await self.resumes.aclose()
        if self._reads is not None:
            await self._reads.aclose()
            self._reads = None


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
