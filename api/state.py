"""What every route needs (settings, config, broker, metrics, the decision service), kept on
`app.state.api`.

The API holds no state of its own beyond connections: everything lives in Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from api.metrics import ApiMetrics
from broker.domain.config import Config
from broker.domain.models import Decision, Outcome
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import Principal
from broker.domain.settings import Settings
from broker.facade import AsyncReads, Broker, Once
from broker.judge.deciding import INBOX, Deciding
from broker.judge.rule_decisions import Remember, RuleDecisions


@dataclass
class ApiState:
    settings: Settings
    config: Config
    broker: Broker
    metrics: ApiMetrics
    _reads: AsyncReads | None = field(default=None, repr=False)
    deciding: Deciding = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.deciding = Deciding(self.broker, self.config)

    def decide(
        self,
        request_id: str,
        decision: Decision,
        principal: Principal,
        *,
        channel: str,
        via: Collection[str],
        decided_by: str | None = None,
        current: BrokerRequest | None = None,
        once: Once | None = None,
    ) -> BrokerRequest:
        """The decision service (`broker.judge.deciding`), counted in the metrics as `channel`."""
        done = self.deciding.decide(
            request_id,
            decision,
            principal,
            via=via,
            decided_by=decided_by,
            current=current,
            once=once,
        )
        if done.recorded and decision.outcome is not Outcome.escalated:
            self.metrics.observe_decision(done.request, channel)
        return done.request

    def remember(
        self,
        request_id: str,
        decision: Decision,
        principal: Principal,
        spec: Remember,
        *,
        channel: str,
        via: Collection[str] = (INBOX,),
        decided_by: str | None = None,
        once: Once | None = None,
    ) -> BrokerRequest:
        """Decide and keep a rule (`broker.judge.rule_decisions`), counted as `channel`.
        A rule that exists already is 409 `rule_exists`."""
        done = RuleDecisions(self.deciding).decide(
            request_id, decision, principal, spec, via=via, decided_by=decided_by, once=once
        )
        if done.recorded:
            self.metrics.observe_decision(done.request, channel)
        return done.request

    def reads(self) -> AsyncReads:
        """The core's asyncio reads on the broker's Redis (or Redis Cluster): event streams,
        runs (`broker.store.async_reads`)."""
        if self._reads is None:
            self._reads = self.broker.async_reads(self.settings.redis_url)
        return self._reads

    async def aclose(self) -> None:
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
