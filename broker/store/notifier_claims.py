"""Who holds which entry of the `notifiers` group: taking over what dead consumers left, and
keeping what a live one holds.

Why a store service: the notifier's reclaimer and heartbeat (`notifiers.reclaim`,
`notifiers.heartbeat`) decide when to look and what to do with an entry handed out too often or
gone; the commands (XAUTOCLAIM, XPENDING, XRANGE, XCLAIM) and the shapes of their replies across
Redis versions are the store's. Entries come back decoded.

It must never acknowledge or dead-letter an entry (that is `broker.store.dropped_entries`, after
the caller wrote the letter), nor hand back an entry whose fields are gone as if it were live.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.redis.replies import as_str
from broker.store.handles import Store
from broker.store.keys import NOTIFIER_GROUP
from broker.store.notifier_reads import Entry, decoded, group_calls

CHUNK = 500
"""Entry ids per XCLAIM when a consumer keeps what it holds."""


@dataclass
class Claimed:
    """One XAUTOCLAIM: the entries taken over, and where the scan goes on (`done` at its end)."""

    cursor: str
    entries: list[Entry] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    """Ids deleted from the stream that Redis 7 took out of the group itself (acknowledged)."""
    lost_some: bool = False
    """Redis 6.2 hands deleted entries back as nil, still pending: `gone_of` finds them."""

    @property
    def done(self) -> bool:
        return self.cursor == "0-0"


class NotifierClaims:
    """The `notifiers` group's pending entries (see the module's docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def take_over(
        self, stream: str, consumer: str, idle_ms: int, cursor: str, count: int
    ) -> Claimed:
        """Up to `count` entries of `stream` idle longer than `idle_ms`, now `consumer`'s,
        scanning from `cursor` ("0-0": the start)."""
        with group_calls():
            reply = self.store.redis.xautoclaim(
                stream, NOTIFIER_GROUP, consumer, idle_ms, cursor, count=count
            )
        claimed = reply[1]
        live = [(eid, f) for eid, f in claimed if eid is not None and f is not None]
        deleted = [as_str(i) for i in reply[2]] if len(reply) > 2 and reply[2] else []
        return Claimed(as_str(reply[0]), decoded(live), deleted, len(live) < len(claimed))

    def times_delivered(self, stream: str, ids: list[str]) -> list[int]:
        """How often the group handed out each of `ids` (0: no longer pending), in one pipeline."""
        pipe = self.store.redis.pipeline(transaction=False)
        for eid in ids:
            pipe.xpending_range(stream, NOTIFIER_GROUP, eid, eid, 1)
        with group_calls():
            replies = pipe.execute()
        return [int(info[0]["times_delivered"]) if info else 0 for info in replies]

    def pending_of(self, stream: str, consumer: str, count: int) -> list[str]:
        """The ids of up to `count` entries of `stream` that `consumer` holds."""
        rows: Any
        with group_calls():
            rows = self.store.redis.xpending_range(
                stream, NOTIFIER_GROUP, "-", "+", count, consumername=consumer
            )
        return [as_str(r["message_id"]) for r in rows]

    def gone_of(self, stream: str, ids: list[str]) -> list[str]:
        """Those of `ids` no longer in `stream` (trimmed or deleted), in one pipeline."""
        pipe = self.store.redis.pipeline(transaction=False)
        for eid in ids:
            pipe.xrange(stream, eid, eid)
        return [eid for eid, found in zip(ids, pipe.execute(), strict=True) if not found]

    def keep(self, stream: str, consumer: str, ids: list[str]) -> None:
        """Reset the idle time of entries `consumer` holds (XCLAIM to itself), so no other
        consumer takes them over from a live one: a heartbeat, one XCLAIM per `CHUNK` ids."""
        for i in range(0, len(ids), CHUNK):
            chunk: list[Any] = ids[i : i + CHUNK]
            with group_calls():
                self.store.redis.xclaim(stream, NOTIFIER_GROUP, consumer, 0, chunk, justid=True)
