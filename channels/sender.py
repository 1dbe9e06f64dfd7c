"""What a channel's sender is, and what it is handed: one delivery of one event.

The notifier (`notifiers/`) reads the streams, routes each event to the channels that want it
and calls each channel's `Sender.deliver` in that channel's own threads (or `Sender.adeliver` on
the sender's own event loop, when it has one); a sender says how to
put the event in front of people (post, mail, POST) and nothing about streams or retries' timing.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from broker.domain.events import Event
from broker.domain.models import Request
from channels.retry import RetryPolicy

T = TypeVar("T")


class Delivery(Protocol):
    """One event on its way to one channel, as a sender sees it (the notifier's `Task`).

    `scratch` lasts across the delivery's retries (`memo` computes a value into it once), so a
    retry sends the same bytes; `request_json` is the request as the contract's JSON, read
    from its stored fields when the notifier has them (None: build it from `request`).
    """

    @property
    def event(self) -> Event: ...

    @property
    def request(self) -> Request: ...

    @property
    def scratch(self) -> dict[str, Any]: ...

    def memo(self, key: str, make: Callable[[], T]) -> T: ...

    def request_json(self) -> bytes | None: ...


class Sender(ABC):
    """What delivers to one named channel (`slack:approvals`, `webhook:ops`, ...).

    `deliver` runs in the channel's own worker threads, so a slow channel only slows itself.
    It returns a short note for the request's history (None: nothing needed doing), or raises
    `Retry`, `GiveUp` or `Defer` (see channels.retry).
    """

    kind: str = ""
    sends: bool = True
    """False for a channel that never sends anything (the inbox: its page reads Redis). A
    notifier whose channels all say so has nothing to deliver (`notifiers.router`)."""

    def __init__(self, name: str, *, policy: RetryPolicy, concurrency: int) -> None:
        self.name = name
        self.policy = policy
        self.concurrency = concurrency
        self.not_before = 0.0  # monotonic time before which the far end asked not to be called

    def wants(self, event: Event) -> bool:
        """Whether this kind of event needs delivering here at all."""
        return True

    @abstractmethod
    def deliver(self, delivery: Delivery) -> str | None: ...

    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this sender delivers on, if it has one: the notifier then runs each
        attempt there as `adeliver` (no thread per attempt); None: `deliver` in the channel's
        threads."""
        return None

    async def adeliver(self, delivery: Delivery) -> str | None:
        """`deliver` on `event_loop()` (same answers, same exceptions)."""
        raise NotImplementedError(f"{type(self).__name__} has no event loop to deliver on")

    def close(self) -> None:
        """Release connections; called once when the notifier stops."""
        return None
