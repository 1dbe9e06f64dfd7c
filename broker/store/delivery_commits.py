"""The notifier committer's batch written to Redis: done markers, history notes, delivery
counters, settled parked deliveries, then the acknowledgements.

Why a store service: the committer (`notifiers.commit`) decides what a batch of delivery results
means (which entries are finished, which notes to write); the keys, the commands and how they
travel are the store's. A batch is one round trip: on a single Redis one Lua step (`commit.lua`,
through the one script loader: one command, not about four per delivery), on a cluster (keys of
many slots) or for a batch that settles parked deliveries one pipeline, the same writes in the
same order. Acknowledgements come last either way, so an entry is never acknowledged before its
done markers.

A write Redis refuses is counted and skipped, the rest still happen; `write` returns the
refusals for the caller to report. It must never repeat a batch itself (notes and counters would
be written twice; the caller repeats one whose connection failed), nor decide what to write.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from redis import Redis

from broker.store.handles import Store
from broker.store.keys import NOTIFIER_GROUP
from broker.store.parked import ParkedDeliveries
from broker.store.requests import Requests


@dataclass
class CommitBatch:
    """The Redis writes of one batch, computed once so a failed write can be repeated as is."""

    done: list[tuple[str, str]] = field(default_factory=list)  # (request id, done field)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (request id, entry JSON)
    stats: Counter[str] = field(default_factory=Counter)  # counter name -> by
    acks: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # stream -> ids
    unpark: list[tuple[str, str]] = field(default_factory=list)  # (channel, parked task id)


@dataclass(frozen=True)
class Refused:
    """Writes of a batch that Redis refused (dropped, not repeated): how many of how many, and
    the first one's error."""

    count: int
    of: int | None  # None: the batch was one step, which reports no total
    first: str


class DeliveryCommits:
    """Writes committer batches (see the module's docstring)."""

    def __init__(self, store: Store, requests: Requests, parked: ParkedDeliveries) -> None:
        self.store = store
        self.requests = requests
        self.parked = parked

    @property
    def one_step(self) -> bool:
        """Whether a batch without parked deliveries goes as one Lua step (a single Redis,
        where every key is in reach of one script); else as one pipeline."""
        return isinstance(self.store.redis, Redis) and self.store.keys.partitions <= 1

    def write(self, batch: CommitBatch) -> Refused | None:
        """Write `batch` in one round trip; what Redis refused, or None. Connection errors are
        raised (nothing is known to be written: the caller repeats the batch)."""
        if self.one_step and not batch.unpark:
            return self._write_step(batch)
        return self._write_pipeline(batch)

    def _write_step(self, batch: CommitBatch) -> Refused | None:
        """The batch as `commit.lua` (see its header for the layout of KEYS and ARGV)."""
        keys = self.store.keys
        names = [keys.delivery(rid) for rid, _ in batch.done]
        names += [keys.request(rid) for rid, _ in batch.notes]
        args: list[str | int] = [NOTIFIER_GROUP, len(batch.done), len(batch.notes)]
        args += [len(batch.stats), len(batch.acks)]
        args += [done_field for _, done_field in batch.done]
        args += [entry for _, entry in batch.notes]
        if batch.stats:
            names.append(keys.stats)
            for name, count in batch.stats.items():
                args += [name, count]
        for stream, ids in batch.acks.items():
            names.append(stream)
            args.append(len(ids))
            args += ids
        if len(names) == 0:
            return None
        if keys.audit_keep_s and batch.notes:  # each delivery note also goes to the audit trail
            names += [keys.audit, keys.audit_head]
            args += [keys.audit_keep_s, *(rid for rid, _ in batch.notes)]
        refused, first = self.store.scripts.run_flat("commit", names, args)
        if int(refused):
            return Refused(int(refused), None, str(first))
        return None

    def _write_pipeline(self, batch: CommitBatch) -> Refused | None:
        keys = self.store.keys
        pipe = self.store.redis.pipeline(transaction=False)
        for request_id, done_field in batch.done:
            pipe.hset(keys.delivery(request_id), done_field, "1")
        for request_id, entry in batch.notes:
            self.requests.add_delivery_note(request_id, entry, pipe=pipe)
        for name, count in batch.stats.items():
            pipe.hincrby(keys.stats, name, count)
        for channel, task_id in batch.unpark:
            self.parked.remove(channel, task_id, pipe)
        for stream, ids in batch.acks.items():
            pipe.xack(stream, NOTIFIER_GROUP, *ids)
        if not len(pipe):
            return None
        results = pipe.execute(raise_on_error=False)
        refused = [r for r in results if isinstance(r, Exception)]
        if refused:
            return Refused(len(refused), len(results), str(refused[0]))
        return None
