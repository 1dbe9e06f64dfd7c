"""What a channel's inbound routes are handed: the host app's services, as a dependency.

The app that mounts a channel's routes (the API) keeps an `InboundHost` at
`app.state.channel_host`; a route asks for it with the `Host` dependency. Deciding goes through
the host's judge (`broker.judge.Judge`): roles, the channel binding, the creator rule and one
vote per person hold on every channel alike, and the judge tells the host of each decision it
records (the API counts them in its metrics).
"""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, Request

from broker.domain.config import Config
from broker.facade import Broker
from broker.judge import Judge

HOST_ATTR = "channel_host"


class InboundHost(Protocol):
    """The services a channel's inbound route uses (the API's state implements it)."""

    @property
    def config(self) -> Config: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def judge(self) -> Judge: ...


def host_of(request: Request) -> InboundHost:
    """The mounting app's host, for a hot route that takes the request anyway (one dependency
    fewer to solve per call)."""
    host: InboundHost = getattr(request.app.state, HOST_ATTR)
    return host


async def get_host(request: Request) -> InboundHost:
    """FastAPI dependency: the mounting app's host (async: no thread hop for a lookup)."""
    return host_of(request)


Host = Annotated[InboundHost, Depends(get_host)]
