"""New entries of the handler queues' streams, as the `notifiers` consumer group reads them.

Why a store service: the notifier's reading thread (`notifiers.reader`) owns the loop, its
timing and its back-off; which streams there are (one per queue and partition), the group's
set-up and the XREADGROUP calls (one blocking read on a single Redis, one read per hash slot on
a cluster, where a read spans one slot) are the store's. Entries come back decoded.

It must never acknowledge, route or drop an entry (what was read stays pending in the group until
the committer acknowledges it, `broker.store.delivery_commits`), and never wait on its own
beyond the read's `block_ms`: pausing between a cluster's non-blocking reads is the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from redis.crc import key_slot
from redis.exceptions import ResponseError

from broker.redis.replies import as_str, as_str_dict
from broker.store import streams as groups
from broker.store.handles import Store
from broker.store.keys import NOTIFIER_GROUP

Entry = tuple[str, dict[str, str]]
"""A stream entry: (entry id, fields)."""


class GroupMissing(ResponseError):
    """The stream or its `notifiers` group was deleted under a reader (Redis's NOGROUP): make
    the groups again (`NotifierReads.ensure_groups`)."""


@contextmanager
def group_calls() -> Iterator[None]:
    """Raise Redis's NOGROUP refusal as `GroupMissing`; any other error as it is."""
    try:
        yield
    except ResponseError as exc:
        if "NOGROUP" in str(exc):
            raise GroupMissing(str(exc)) from exc
        raise


def decoded(entries: Iterable[tuple[Any, Any]]) -> list[Entry]:
    """Stream entries as a reply gives them (bytes), as text."""
    return [(as_str(eid), as_str_dict(fields)) for eid, fields in entries]


class Feed:
    """The new entries of a fixed set of streams, read through the `notifiers` group."""

    def __init__(self, store: Store, streams: Iterable[str]) -> None:
        self.redis = store.redis
        by_slot: dict[int, dict[Any, Any]] = {}
        for stream in streams:
            by_slot.setdefault(key_slot(stream.encode()), {})[stream] = ">"
        self._slots = list(by_slot.values())  # each as XREADGROUP's {stream: ">"}

    @property
    def blocks(self) -> bool:
        """Whether `read` waits for entries (one slot: one blocking read of every stream); on a
        cluster it never does, and the caller paces its polls."""
        return len(self._slots) == 1

    def read(
        self, consumer: str, count: int, block_ms: int | None
    ) -> list[tuple[str, list[Entry]]]:
        """Up to `count` new entries per stream read, as (stream, entries); raises
        `GroupMissing` when a stream or the group is gone."""
        got: Any
        with group_calls():
            if self.blocks:
                got = self.redis.xreadgroup(
                    NOTIFIER_GROUP, consumer, self._slots[0], count=count, block=block_ms
                )
            else:
                got = []
                for streams in self._slots:
                    got += self.redis.xreadgroup(NOTIFIER_GROUP, consumer, streams, count=count)
        return [(as_str(stream), decoded(entries)) for stream, entries in got or []]


class NotifierReads:
    """The handler queues' streams and the `notifiers` group on them."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def streams(self, queues: Iterable[str]) -> dict[str, str]:
        """Every stream of `queues` (one per queue and partition) -> its queue's name."""
        names = list(queues)
        return {k.stream(q): q for k in self.store.keys.parts() for q in names}

    def ensure_groups(self, streams: Iterable[str]) -> None:
        """Make the `notifiers` group (and the stream) on each of `streams` unless it exists."""
        for stream in streams:
            groups.ensure_group(self.store.redis, stream, NOTIFIER_GROUP)

    def feed(self, streams: Iterable[str]) -> Feed:
        return Feed(self.store, streams)
