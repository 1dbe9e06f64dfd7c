"""The API's asyncio reads: the streams it follows (queues, run events) and the runs it serves.

Every outcome is announced on its request's queue stream by the Lua step that records it, and
every run that pauses or ends on its partition's run-events stream (`broker.store.run_state`).
The API follows those streams with XREAD (event streams, long-polls) and reads runs on an
asyncio client, so no read holds a thread. Which streams there are (one set per partition on a
Redis Cluster, a slot each), their newest ids, the XREAD and the run's reads are here; where a
reader stands, who is woken and what is sent are the API's (`api.follow`, `api.event_reads`).
A run is read with the same commands as the sync store (`run_read`, `run_from`), sent with
the rest of a pass of the loop (`broker.store.coalesced`: the decide steps' batch). Built by
`Broker.async_reads` on a client of its own: a redis.asyncio client is bound to the event loop it
first runs on, so make one per loop. Reads only.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.domain.models import Run
from broker.redis.async_client import AsyncRedis, socket_timeout
from broker.redis.replies import Entry, as_positions, as_str_dict, as_streams
from broker.store.coalesced import Coalesced
from broker.store.keys import Keys
from broker.store.run_state import run_from, run_read

Entries = list[Entry]
"""One stream's entries as Redis sends them: (id, fields), both as bytes."""
Batch = list[tuple[str, Entries]]
"""What an XREAD gave: each stream's name and its entries."""


class AsyncReads:
    """Reads on one asyncio client (`Broker.async_reads`); `aclose` when done with it."""

    def __init__(self, client: AsyncRedis, keys: Keys, coalesced: Coalesced | None = None) -> None:
        self.client = client
        self.keys = keys
        self.coalesced = coalesced or Coalesced()
        """Batches this client's commands per pass of the loop; the broker's scripts' own, so
        the reads go with the decide steps (`Broker.async_reads`)."""

    @property
    def partitions(self) -> int:
        """Partitions of the key schema: 1 on a single Redis, one slot each on a cluster."""
        return max(self.keys.partitions, 1)

    def queue_streams(self, queues: Iterable[str]) -> dict[str, str]:
        """On a single Redis: each queue's stream name -> the queue."""
        return {self.keys.stream(q): q for q in queues}

    def partition_streams(self, queues: Iterable[str]) -> list[list[str]]:
        """The queues' streams, one list per partition (in the order of `queues`)."""
        names = list(queues)
        return [[part.stream(q) for q in names] for part in self.keys.parts()]

    def followed_streams(self, queues: Iterable[str]) -> list[list[str]]:
        """Per partition: the queues' streams and the run-events stream (what wakes long-polls
        on requests and runs, and event streams on a cluster)."""
        names = list(queues)
        return [[*(part.stream(q) for q in names), part.run_events] for part in self.keys.parts()]

    def run_streams(self) -> list[str]:
        """Every partition's run-events stream."""
        return [part.run_events for part in self.keys.parts()]

    async def newest(self, streams: list[str]) -> dict[str, str]:
        """The id of each stream's newest entry now ("0-0" if empty), so nothing later is
        missed; one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for stream in streams:
            pipe.xrevrange(stream, count=1)
        rows = await pipe.execute()
        return {s: r[0][0].decode() if r else "0-0" for s, r in zip(streams, rows, strict=True)}

    async def read(self, cursor: dict[str, str], count: int, block_ms: int | None = None) -> Batch:
        """XREAD from each stream's position in `cursor` (on a cluster: streams of one slot),
        at most `count` entries each, blocking up to `block_ms` when given and nothing is there."""
        got = as_streams(await self.client.xread(as_positions(cursor), count=count, block=block_ms))
        return [(raw.decode(), entries) for raw, entries in got or []]

    async def run(self, run_id: str) -> tuple[Run, str | None]:
        """A run and who started it, its hash and pending set in one round trip; NotFound for
        an unknown run."""
        raw, members = await self.coalesced.send_all(self.client, run_read(self.keys, run_id))
        fields = as_str_dict(raw)
        return run_from(run_id, fields, members), fields.get("started_by") or None

    def socket_timeout(self) -> float | None:
        """The client's socket timeout: a blocking read must end well before it."""
        return socket_timeout(self.client)

    async def aclose(self) -> None:
        await self.client.aclose()
