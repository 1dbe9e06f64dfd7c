"""Parked deliveries in Redis: one channel's share of a stream entry, handed on by a notifier so
the entry can be acknowledged (the notifier's `notifiers.parking` says when and why).

Per channel, a ZSET of task ids scored by when one may next take the delivery, and a hash of
task id -> record (the notifier's JSON: the event and the attempts so far). `take` leases due
ones to the caller in one step (`take_parked.lua`, through the one script loader): the score
moves to the lease's end, and the holder's heartbeat keeps pushing it (`renew`); a dead
holder's lease lapses and another notifier takes the delivery over.

Why a store service: the notifier decides when to park, retry and give up; this module only
keeps the two keys consistent (every write of both keys is one MULTI, or one Lua step). It must
never read a record (its shape is the notifier's), decide anything about a delivery, or block
while holding a lock of the caller's: it is called outside the dispatcher's lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.store.handles import Store

Record = tuple[str, str, str, float]
"""A parked delivery to write: (channel, task id, record, when it may next be taken, epoch s)."""


class ParkedDeliveries:
    """Every channel's parked deliveries (`Keys.parked`, `Keys.parked_tasks`)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def park(self, records: Iterable[Record]) -> None:
        """Store deliveries with when each may next be taken, all or none (MULTI)."""
        keys = self.store.keys
        pipe = self.store.redis.pipeline(transaction=True)
        for channel, task, record, due in records:
            pipe.hset(keys.parked_tasks(channel), task, record)
            pipe.zadd(keys.parked(channel), {task: due})
        if len(pipe):
            pipe.execute()

    def take(self, channel: str, count: int, now: float, until: float) -> list[tuple[str, str]]:
        """Up to `count` deliveries due by `now` as (task id, record), leased until `until`."""
        keys = self.store.keys
        flat = self.store.scripts.run_flat(
            "take_parked",
            [keys.parked(channel), keys.parked_tasks(channel)],
            [f"{now:.6f}", f"{until:.6f}", count],
        )
        return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]

    def renew(self, held: dict[str, list[str]], until: float) -> None:
        """Push the leases of the deliveries held (channel -> task ids) to `until`; finished
        ones (no longer in the schedule) are not brought back."""
        keys = self.store.keys
        pipe = self.store.redis.pipeline(transaction=False)
        for channel, ids in held.items():
            if ids:
                pipe.zadd(keys.parked(channel), dict.fromkeys(ids, until), xx=True)
        if len(pipe):
            pipe.execute()

    def reschedule(self, channel: str, task: str, record: str, due: float) -> None:
        """Give a delivery back until `due`, with its new record (MULTI)."""
        self.settle([(channel, task, record, due)], [])

    def settle(self, due: list[Record], finished: list[tuple[str, str]]) -> None:
        """Give deliveries back (each with its record and due time; only those still scheduled)
        and forget finished ones (channel, task id), in one MULTI."""
        keys = self.store.keys
        pipe = self.store.redis.pipeline(transaction=True)
        for channel, task, record, when in due:
            pipe.hset(keys.parked_tasks(channel), task, record)
            pipe.zadd(keys.parked(channel), {task: when}, xx=True)
        for channel, task in finished:
            self.remove(channel, task, pipe)
        if len(pipe):
            pipe.execute()

    def remove(self, channel: str, task: str, pipe: Any = None) -> None:
        """Forget a delivery that is done or dead-lettered (queued into `pipe` when given, a
        store's pipeline such as `broker.store.delivery_commits`'s)."""
        keys = self.store.keys
        target: Any = pipe if pipe is not None else self.store.redis.pipeline(transaction=True)
        target.zrem(keys.parked(channel), task)
        target.hdel(keys.parked_tasks(channel), task)
        if pipe is None:
            target.execute()

    def count(self, channel: str) -> int:
        """How many deliveries of `channel` are parked (due or leased)."""
        return int(self.store.redis.zcard(self.store.keys.parked(channel)))
