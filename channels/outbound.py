"""What a channel's sender is handed when the notifier builds it: the notifier's services.

The notifier (`notifiers.runner`) makes one `OutboundHost` and asks each channel kind's plugin
for a sender per channel name in use; a kind shares one platform client among its channels
through `shared`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from broker.domain.config import Config
from broker.facade import Broker, DeliveryState
from channels.retry import RetryPolicy

T = TypeVar("T")


class OutboundHost(Protocol):
    """The notifier's side of a sender: where state lives and how hard to try."""

    @property
    def broker(self) -> Broker: ...

    @property
    def config(self) -> Config: ...

    @property
    def deliveries(self) -> DeliveryState:
        """Posted copies, done markers and disabled endpoints (in Redis, shared by notifiers)."""
        ...

    @property
    def consumer(self) -> str:
        """This notifier's name (claims to post a card are made in it)."""
        ...

    @property
    def policy(self) -> RetryPolicy:
        """The notifier's retry policy (a kind with its own, such as webhooks, ignores it)."""
        ...

    @property
    def threads(self) -> int:
        """Delivery threads a channel may use."""
        ...

    @property
    def claim_idle_s(self) -> float:
        """How long an entry may sit unacknowledged before another notifier takes it."""
        ...

    def timeout_s(self, name: str, default: float) -> float:
        """The call timeout named `name` (APPROVAL_BROKER_NOTIFIER_{NAME}_TIMEOUT_S)."""
        ...

    def shared(self, key: str, make: Callable[[], T]) -> T:
        """One object per `key` for the notifier's life (a kind's platform client)."""
        ...
