"""The notifier's side of a sender (`channels.outbound.OutboundHost`): what a channel kind's
plugin is handed to build the sender of each channel."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from broker.domain.config import Config
from broker.facade import Broker
from channels.retry import RetryPolicy
from notifiers.options import NotifierOptions

T = TypeVar("T")


class NotifierHost:
    """One notifier's broker, options and shared platform clients."""

    def __init__(
        self, broker: Broker, config: Config, options: NotifierOptions, consumer: str
    ) -> None:
        self.broker = broker
        self.config = config
        self.options = options
        self.consumer = consumer
        self.deliveries = broker.deliveries
        self.policy = RetryPolicy(options.max_attempts, options.backoff_s, options.max_backoff_s)
        self._shared: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def threads(self) -> int:
        return self.options.workers

    @property
    def claim_idle_s(self) -> float:
        return self.options.claim_idle_s

    def timeout_s(self, name: str, default: float) -> float:
        return self.options.timeout_s(name, default)

    def shared(self, key: str, make: Callable[[], T]) -> T:
        with self._lock:
            if key not in self._shared:
                self._shared[key] = make()
            value: T = self._shared[key]
            return value
