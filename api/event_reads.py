"""How one event stream (`GET /v1/events`) reads the queue streams, and what its event ids say.

On a single Redis: one XREAD BLOCK over every selected queue's stream; an event id names each
queue's position, `default=1733-0&managers=1733-4`. On a Redis Cluster each of the P partitions
has its own streams in a slot of its own, and one XREAD may name one slot only: the stream
waits on the API process's one stream reader (`api.follow`, one blocking read per partition,
shared by every stream and long-poll) to ring, then reads the partitions that rang without
blocking, from its own positions. Its event id names a position per queue and partition, the
partitions' positions joined by dots (`default=1733-0.0.1740-2…`, P of them, `0` for an empty
stream). Events of one request keep their order (a request lives in one partition); events of
different partitions arrive in the order they are read, not by a global clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AbstractContextManager
from urllib.parse import parse_qsl, urlencode

from api.errors import ApiError
from api.follow import Subscriber, Waiter
from broker.domain.stream_ids import BadStreamId, parse_stream_id
from broker.facade import AsyncReads, Batch

BATCH = 100


def encode_position(positions: dict[str, str]) -> str:
    """An event id: each queue's stream position, `default=1733-0&managers=1733-4`."""
    return urlencode(sorted(positions.items()))


def decode_position(last_event_id: str, partitions: int = 1) -> dict[str, str]:
    """The positions a `Last-Event-ID` names; ApiError 400 when it isn't one of our ids.

    Each position is checked by `broker.domain.stream_ids` (the one reader of stream ids from
    outside), so what Redis is handed is an id it reads. With P > 1 partitions a value is P positions
    joined by dots, `0` or `ms` for `ms-0` (or one, an id a single Redis sent, which names no
    partition's position and is ignored)."""
    bad = ApiError(400, "bad_last_event_id", "Last-Event-ID is not an id this stream sent")
    try:
        pairs = parse_qsl(last_event_id, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise bad from None
    if not pairs:
        raise bad
    try:
        for _, value in pairs:
            ids = value.split(".") if partitions > 1 else [value]
            if len(ids) not in (1, partitions):
                raise bad
            for one in ids:
                parse_stream_id(one, seq=partitions <= 1)
    except BadStreamId:
        raise bad from None
    return dict(pairs)


class SingleReader:
    """A single Redis: one XREAD BLOCK over every selected queue's stream."""

    def __init__(self, reads: AsyncReads, queues: list[str]) -> None:
        self.reads = reads
        self.queue_of = reads.queue_streams(queues)
        self.positions: dict[str, str] = {}

    async def start(self, resume_from: dict[str, str] | None) -> None:
        self.positions = await self.reads.newest(list(self.queue_of))
        for stream, queue in self.queue_of.items():
            if resume_from and queue in resume_from:
                self.positions[stream] = resume_from[queue]

    async def next(self, block_ms: int) -> Batch:
        return await self.reads.read(self.positions, BATCH, block_ms=block_ms)

    def event_id(self) -> str:
        return encode_position({q: self.positions[s] for s, q in self.queue_of.items()})

    def close(self) -> None:
        pass


class PartitionReader:
    """A Redis Cluster: every partition's streams, read when the process's reader rings."""

    def __init__(self, reads: AsyncReads, queues: list[str], waiter: Waiter) -> None:
        self.reads = reads
        self.waiter = waiter
        self.groups = reads.partition_streams(queues)
        self.streams_of = {q: [g[i] for g in self.groups] for i, q in enumerate(queues)}
        self.positions: dict[str, str] = {}
        self._subscription: AbstractContextManager[Subscriber] | None = None
        self._sub: Subscriber | None = None

    async def start(self, resume_from: dict[str, str] | None) -> None:
        self._subscription = self.waiter.subscribed()
        self._sub = self._subscription.__enter__()  # every partition is read once to begin
        self.positions = await self.reads.newest([s for g in self.groups for s in g])
        for queue, streams in self.streams_of.items():
            ids = (resume_from or {}).get(queue, "").split(".")
            if len(ids) == len(streams):  # one id alone came from a single Redis: from now
                for stream, entry in zip(streams, ids, strict=True):
                    self.positions[stream] = entry if "-" in entry else f"{entry}-0"

    async def next(self, block_ms: int) -> Batch:
        sub = self._sub
        assert sub is not None, "start() first"
        await self.waiter.ensure_reader()
        if not sub.dirty:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sub.event.wait(), block_ms / 1000)
        sub.event.clear()  # before reading: a ring during the reads is not lost
        parts, sub.dirty = sorted(sub.dirty), set()
        reads = [self._read(self.groups[p]) for p in parts]
        out: Batch = []
        for p, got in zip(parts, await asyncio.gather(*reads), strict=True):
            out += got
            if any(len(entries) >= BATCH for _, entries in got):
                sub.dirty.add(p)  # more where that came from: read on at once
        return out

    async def _read(self, streams: list[str]) -> Batch:
        cursor = {s: self.positions[s] for s in streams}
        return await self.reads.read(cursor, BATCH)

    def event_id(self) -> str:
        def short(entry: str) -> str:
            return "0" if entry == "0-0" else entry

        return encode_position(
            {q: ".".join(short(self.positions[s]) for s in ss) for q, ss in self.streams_of.items()}
        )

    def close(self) -> None:
        if self._subscription is not None:
            self._subscription.__exit__(None, None, None)
            self._subscription = None
