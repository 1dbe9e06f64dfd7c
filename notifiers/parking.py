"""Parked deliveries: one channel's share of a stream entry, handed on so the entry can be acked.

A slow or failing channel (Slack hung, an endpoint backing off) would otherwise keep its entries
in flight until every channel had them, and once `max_inflight` filled, the healthy channels
would wait too. A parked delivery lives in Redis per channel (`broker.parked`, the store's): a
schedule of task ids by when one may next take it, and the record of what to deliver (`Parked`:
the event and the attempts so far, as JSON this module writes and reads).

Any notifier takes due ones (`take`, one step) under a lease that lasts `lease_s`, and the
taker's heartbeat keeps pushing it (`renew`). A notifier killed mid-delivery stops
renewing, so the lease lapses and another takes the task over: at least once, as for entries.
A retry puts the task back with its new attempt count and due time (`reschedule`); delivery or
the dead letter after the last try removes it (the committer, in its batch).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from broker.domain.events import Event, MalformedEntry, parse_entry
from broker.facade import Broker


@dataclass(frozen=True)
class Parked:
    """One parked delivery as stored: enough to rebuild its event and go on counting tries."""

    id: str
    channel: str
    stream: str
    queue: str
    entry_id: str
    fields: dict[str, str]
    attempts: int = 0
    defers: int = 0

    @classmethod
    def of(cls, event: Event, channel: str, attempts: int, defers: int) -> Parked:
        return cls(
            id=task_id(event),
            channel=channel,
            stream=event.stream,
            queue=event.queue,
            entry_id=event.entry_id,
            fields=event.dead_letter_entry(),
            attempts=attempts,
            defers=defers,
        )

    def dump(self) -> str:
        return json.dumps(
            {
                "stream": self.stream,
                "queue": self.queue,
                "entry_id": self.entry_id,
                "fields": self.fields,
                "attempts": self.attempts,
                "defers": self.defers,
            },
            separators=(",", ":"),
        )

    @classmethod
    def load(cls, channel: str, task: str, raw: str) -> Parked:
        """Raises MalformedEntry for a record no notifier can use."""
        try:
            data: Any = json.loads(raw)
            return cls(
                id=task,
                channel=channel,
                stream=str(data["stream"]),
                queue=str(data["queue"]),
                entry_id=str(data["entry_id"]),
                fields={str(k): str(v) for k, v in dict(data["fields"]).items()},
                attempts=int(data.get("attempts", 0)),
                defers=int(data.get("defers", 0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedEntry(f"unreadable parked delivery: {exc}") from None

    def event(self) -> Event:
        return parse_entry(self.stream, self.queue, self.entry_id, self.fields)


def task_id(event: Event) -> str:
    """Stable per event and queue, so parking the same delivery twice keeps one record; the
    request's id makes it unique across a cluster's partitions, whose streams of one queue may
    hand out the same entry id (a record parked before it was in the id keeps its own id)."""
    return f"{event.request_id}:{event.event_id}:{event.queue}"


class ParkedStore:
    """Parked deliveries as `Parked` records, leased for `lease_s` (the Redis side is
    `broker.parked`)."""

    def __init__(self, broker: Broker, lease_s: float) -> None:
        self.parked = broker.parked
        self.lease_s = lease_s

    def park(self, items: Iterable[tuple[Parked, float]]) -> None:
        """Store deliveries with when each may next be taken, all or none."""
        self.parked.park((p.channel, p.id, p.dump(), due) for p, due in items)

    def take(self, channel: str, count: int, now: float | None = None) -> list[tuple[str, str]]:
        """Up to `count` due deliveries as (id, raw record), leased to the caller."""
        now = time.time() if now is None else now
        return self.parked.take(channel, count, now, now + self.lease_s)

    def renew(self, held: dict[str, list[str]]) -> None:
        """Push the leases of deliveries we work on ahead; finished ones are not brought back."""
        self.parked.renew(held, time.time() + self.lease_s)

    def reschedule(self, parked: Parked, due: float) -> None:
        """Give a delivery back until `due`, with its new counts."""
        self.parked.reschedule(parked.channel, parked.id, parked.dump(), due)

    def settle(self, due: list[tuple[Parked, float]], finished: list[Parked]) -> None:
        """After parking: give released deliveries back for `due` (with their counts as they
        are now), and forget those that finished while they were being parked (all at once)."""
        self.parked.settle(
            [(p.channel, p.id, p.dump(), when) for p, when in due],
            [(p.channel, p.id) for p in finished],
        )

    def remove(self, channel: str, task: str) -> None:
        """Forget a delivery that is done or dead-lettered."""
        self.parked.remove(channel, task)

    def count(self, channel: str) -> int:
        return self.parked.count(channel)
