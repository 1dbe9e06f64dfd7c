"""What a channel's inbound routes are handed: the host app's services, as a dependency.

The app that mounts a channel's routes (the API) keeps an `InboundHost` at
`app.state.channel_host`; a route asks for it with the `Host` dependency. Deciding goes through
the host's judge (`broker.judge`): roles, the channel binding, the creator rule and one vote per
person hold on every channel alike; the host counts each decision in its metrics.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Protocol

from fastapi import Depends, Request

from broker.domain.config import Config
from broker.domain.models import Decision
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import Principal
from broker.facade import Broker, Once
from broker.judge.deciding import Deciding
from broker.judge.rule_decisions import Remember

HOST_ATTR = "channel_host"


class InboundHost(Protocol):
    """The services a channel's inbound route uses (the API's state implements it)."""

    @property
    def config(self) -> Config: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def deciding(self) -> Deciding: ...

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
    ) -> BrokerRequest: ...

    def remember(
        self,
        request_id: str,
        decision: Decision,
        principal: Principal,
        spec: Remember,
        *,
        channel: str,
        via: Collection[str],
        decided_by: str | None = None,
        once: Once | None = None,
    ) -> BrokerRequest: ...


async def get_host(request: Request) -> InboundHost:
    """FastAPI dependency: the mounting app's host (async: no thread hop for a lookup)."""
    host: InboundHost = getattr(request.app.state, HOST_ATTR)
    return host


Host = Annotated[InboundHost, Depends(get_host)]
