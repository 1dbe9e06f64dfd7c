"""The one reader of the queue streams per API process and event loop (`Waiter`).

Every outcome is announced on its request's queue stream by the same Lua step that records it,
and every run that pauses or ends on its partition's run-events stream; the core names those
streams and reads them (`broker.store.async_reads`). This reader follows them (XREAD BLOCK)
while anyone listens, and wakes whoever waits:
long-polls by request or run id (`watching`), event streams on a cluster by partition
(`subscribed`).
On a Redis Cluster each partition's streams share a slot of their own, and one XREAD may
name one slot only, so it keeps one blocking read per partition in flight and handles
whichever answers first. It fixes its stream positions *before* a listener first reads, so
anything recorded after that read is seen. Once nobody listens it sends no new read and
stops when those in flight have returned (within `BLOCK_MS`), rather than cancelling them:
redis-py drops a connection whose reply is still due, so stopping at once cost a new Redis
connection per long-poll (one per partition on a cluster). A long-poll that follows another
(a client that waits for a run to pause, then for it to end) finds the reader still running,
or its connections back in the pool and, within `KEEP_POSITIONS_S`, its positions to read on
from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request as HttpRequest

from api.state import ApiState
from broker.domain.models import Request
from broker.facade import AsyncReads, Batch

log = logging.getLogger("approval_broker.api.follow")

BLOCK_MS = 1000
"""XREAD BLOCK per call: short, well below any socket timeout, so a dead connection shows."""
KEEP_POSITIONS_S = 5.0
"""How long a reader that stopped keeps its stream positions for the next one: a long-poll that
follows another (wait for a run to pause, decide, wait for it to end) reads on from there, with
no round trip to look up the newest ids (entries in between are read, not missed). After a
longer pause the backlog would cost more than that round trip."""
BATCH = 500

Fetch = Callable[[list[str]], Awaitable[list[Request]]]
Ready = Callable[[], Awaitable[bool]]


@dataclass(eq=False)
class Subscriber:
    """A listener to whole partitions: `dirty` names those with entries it has not read."""

    partitions: int
    event: asyncio.Event = field(default_factory=asyncio.Event)
    dirty: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.dirty = set(range(self.partitions))  # read everything once to begin with

    def ring(self, partition: int | None = None) -> None:
        self.dirty |= set(range(self.partitions)) if partition is None else {partition}
        self.event.set()


class Waiter:
    """The stream reader of an API process (per event loop) and who listens to what.

    `groups` holds one list of stream keys per partition (one slot each on a cluster)."""

    def __init__(
        self,
        reads: AsyncReads,
        groups: Sequence[Sequence[str]],
        run_streams: Sequence[str] = (),
    ) -> None:
        self.reads = reads
        self.groups = [list(g) for g in groups]
        self.run_streams = frozenset(run_streams)
        """The run-events streams among `groups`: their entries wake long-polls on runs."""
        self.loop = asyncio.get_running_loop()
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._subscribers: set[Subscriber] = set()
        self._positions: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopped_at: float | None = None
        """When the last reader stopped after reading to its positions (None: never, or it
        stopped on an error)."""
        self._lock = asyncio.Lock()
        self._listening = asyncio.Event()
        """Set when someone starts listening: a reader letting its last reads finish sends the
        reads of the partitions it stopped reading again at once."""

    @property
    def streams(self) -> list[str]:
        return [s for g in self.groups for s in g]

    @contextlib.contextmanager
    def _watching(self, ids: Sequence[str]) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        for rid in ids:
            self._watchers.setdefault(rid, set()).add(event)
        try:
            yield event
        finally:
            for rid in ids:
                events = self._watchers.get(rid)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._watchers[rid]

    @contextlib.contextmanager
    def subscribed(self) -> Iterator[Subscriber]:
        """Be rung on every entry of any partition (an event stream on a cluster)."""
        sub = Subscriber(len(self.groups))
        self._subscribers.add(sub)
        try:
            yield sub
        finally:
            self._subscribers.discard(sub)

    async def ensure_reader(self) -> None:
        """Start the reader if none runs; returns once its positions are fixed."""
        if self._task is not None and not self._task.done():
            self._listening.set()
            return
        async with self._lock:
            if self._task is not None and not self._task.done():
                return
            stopped = self._stopped_at
            if stopped is None or self.loop.time() - stopped > KEEP_POSITIONS_S:
                self._positions = await self.reads.newest(self.streams)
            self._stopped_at = None
            self._task = asyncio.create_task(self._read())

    async def aclose(self) -> None:
        """Stop the reader and close its client (at shutdown: its connections are the API's)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # the reader's own end (cancelled, or a Redis error it died of) is not ours to
            # raise; a cancellation of this call is, and `asyncio.wait` leaves it alone
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved, so it is not logged as never looked at
        await self.reads.aclose()

    def _announce(self, partition: int, got: Batch) -> None:
        for stream, entries in got:
            for raw_id, fields in entries:
                self._positions[stream] = raw_id.decode()
                named = fields.get(b"request_id") or fields.get(b"run_id")
                for event in self._watchers.get(named.decode() if named else "", ()):
                    event.set()
            if entries and stream not in self.run_streams:
                for sub in self._subscribers:  # event streams carry requests' events only
                    sub.ring(partition)

    async def _read(self) -> None:
        in_flight: dict[int, asyncio.Future[Batch]] = {}
        try:
            # with nobody listening, no new read is sent but those in flight are let finish
            # (cancelling one costs its connection); a listener arriving meanwhile is served
            while in_flight or self._watchers or self._subscribers:
                for n, group in enumerate(self.groups):
                    if n not in in_flight and (self._watchers or self._subscribers):
                        cursor = {s: self._positions[s] for s in group}
                        in_flight[n] = asyncio.ensure_future(
                            self.reads.read(cursor, BATCH, block_ms=BLOCK_MS)
                        )
                waiting_for: list[asyncio.Future[Any]] = list(in_flight.values())
                listener = None
                if len(in_flight) < len(self.groups):  # letting reads finish: a listener may come
                    self._listening.clear()
                    listener = asyncio.ensure_future(self._listening.wait())
                    waiting_for.append(listener)
                try:
                    done, _ = await asyncio.wait(waiting_for, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if listener is not None:
                        listener.cancel()
                for n in [n for n, read in in_flight.items() if read in done]:
                    self._announce(n, in_flight.pop(n).result())
            self._stopped_at = self.loop.time()  # every read answered: its positions hold
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis went away: wake everyone to re-read (and restart us)
            log.warning("stream reader stopped: %s", type(exc).__name__)
            for events in self._watchers.values():
                for event in events:
                    event.set()
            for sub in self._subscribers:
                sub.ring()
        finally:
            for read in in_flight.values():
                read.cancel()

    async def until(
        self, ids: Sequence[str], timeout: float, *, every: bool, fetch: Fetch
    ) -> list[Request]:
        """The requests as soon as all (`every`) or one of them are no longer pending, or as
        they stand after `timeout` seconds. An id that does not exist counts as done."""
        ids = list(dict.fromkeys(ids))
        got: list[Request] = []

        async def answered() -> bool:
            nonlocal got
            got = await fetch(ids)
            pending = sum(1 for r in got if r.is_pending)  # a missing id is done
            return pending == 0 or (not every and pending < len(ids))

        await self.watch(ids, timeout, answered)
        return got

    async def watch(self, ids: Sequence[str], timeout: float, ready: Ready) -> None:
        """Return as soon as `ready()` (a read of what is watched) is true, re-reading each
        time an entry names one of `ids` (a request or a run), or after `timeout` seconds."""
        deadline = self.loop.time() + timeout
        with self._watching(ids) as event:
            while True:
                await self.ensure_reader()
                event.clear()  # before reading: a wake-up during the read is not lost
                if await ready():
                    return
                left = deadline - self.loop.time()
                if left <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)


def waiter_for(http: HttpRequest, state: ApiState) -> Waiter:
    """This app's waiter on the running event loop (a new loop gets a new one)."""
    waiter: Waiter | None = getattr(http.app.state, "waiter", None)
    if waiter is None or waiter.loop is not asyncio.get_running_loop():
        reads = state.broker.async_reads(state.settings.redis_url)  # a client for this loop
        waiter = Waiter(reads, reads.followed_streams(state.config.queues), reads.run_streams())
        http.app.state.waiter = waiter
    return waiter
