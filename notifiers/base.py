"""What every delivery channel looks like to the consumer loop."""

from __future__ import annotations

from abc import ABC, abstractmethod

from notifiers.events import Event
from notifiers.retry import RetryPolicy
from notifiers.tasks import Task


class Channel(ABC):
    """A named destination (`slack:approvals`, `webhook:ops`, ...).

    `deliver` runs in the channel's own worker threads, so a slow channel only slows itself.
    It returns a short note for the request's history (None: nothing needed doing), or raises
    `Retry`, `GiveUp` or `Defer` (see notifiers.retry).
    """

    kind: str = ""

    def __init__(self, name: str, *, policy: RetryPolicy, concurrency: int) -> None:
        self.name = name
        self.policy = policy
        self.concurrency = concurrency
        self.not_before = 0.0  # monotonic time before which the far end asked not to be called

    def wants(self, event: Event) -> bool:
        """Whether this kind of event needs delivering here at all."""
        return True

    @abstractmethod
    def deliver(self, task: Task) -> str | None: ...

    def close(self) -> None:
        """Release connections; called once when the notifier stops."""
        return None
