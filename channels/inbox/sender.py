"""The web inbox channel: nothing to send.

The inbox page reads requests straight from Redis and the API's `/v1/events` follows the queue
streams with XREAD, so an event on a queue with "inbox" is there the moment it is written.
"""

from __future__ import annotations

from broker.domain.events import Event
from channels.retry import RetryPolicy
from channels.sender import Delivery, Sender


class InboxSender(Sender):
    kind = "inbox"
    sends = False

    def __init__(self) -> None:
        super().__init__("inbox", policy=RetryPolicy(1, 1.0, 1.0), concurrency=1)

    def wants(self, event: Event) -> bool:
        return False  # always delivered already

    def deliver(self, delivery: Delivery) -> str | None:
        return None
