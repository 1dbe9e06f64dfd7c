"""Outbox entries written by hand, for tests of what readers do with them."""

from __future__ import annotations

from broker.domain.events import REQUESTED, parse_entry
from broker.facade import Broker
from broker.store.keys import NOTIFIER_GROUP
from notifiers.tasks import InflightEntry


def pending_entry(broker: Broker, request_id: str) -> InflightEntry:
    stream = broker.keys.stream("default")
    broker.ensure_group(stream, NOTIFIER_GROUP)
    fields = {"type": REQUESTED, "request_id": request_id}
    broker.redis.xadd(stream, fields)
    ((_, entries),) = broker.redis.xreadgroup(NOTIFIER_GROUP, "t", {stream: ">"}, count=1)
    entry_id = entries[0][0].decode()
    event = parse_entry(stream, "default", entry_id, fields)
    return InflightEntry(event, None, remaining={"webhook:a", "webhook:b"})
