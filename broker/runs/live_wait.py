"""Live waits on the fleet: the job that paused a run waits `live_wait_s` for the round's outcomes
and, when they all arrive in time, goes on in the same job (no resume job, no history reload).

Exactly once still holds because a completed round is *claimed* before anyone continues it:
`HSETNX run:{id} claimed:{round}` with `live` (the waiting job) or `resumer` (the outbox step).
The first writer owns the round; the other backs off: the resumer acknowledges the outbox entry
without enqueueing, the live job stops and leaves the round to the resume job. A live job that
dies after claiming is continued by its own retry (see `AgentRunner.advance`). While a live
job waits, its deadline is on the run (`live_until:{round}`), and the resumer's claim step
leaves a completed round nobody claimed alone until then (`broker/scripts/resume.lua`): the
waiting job is woken by the same outcome and claims it first; a job that died meanwhile costs
the round at most the rest of its wait.

The waits are woken from the handler queues' streams (XREAD BLOCK), where every outcome is
announced in the same atomic step that records it: one reader thread per process and partition
reads them for all the process's waits and wakes the wait whose request an event names (a wait
tries its claim after the reader's positions are fixed, so an outcome can't slip between the
try and the read). The claim is taken only once the round's pending set is empty, in the same
step that checks it and reads what the job goes on with (`claim.lua`): one round trip per
wake-up. A round's requests live in their run's partition
(`Keys.of_run`), so a reader reads that partition's streams only: one slot, one blocking XREAD,
on a single Redis and on a Redis Cluster alike.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterator, Sequence

from redis import Redis
from redis.typing import KeyT, StreamIdT

from broker.facade import Broker
from broker.redis.replies import as_fields, as_str, as_streams
from broker.store.run_state import RoundRead

LIVE = "live"
RESUMER = "resumer"
log = logging.getLogger("broker.runs.live_wait")
BLOCK_S = 1.0
"""Longest single XREAD BLOCK, well below any socket timeout."""


class LiveWaits:
    """How this process's jobs wait live: `default_s` for an agent that sets no `live_wait_s`,
    and at most `most` of them waiting at once (None: no limit).

    A waiting job holds its worker slot, and a round a person answers takes longer than any
    short wait: with no limit, a burst of such pauses would leave no slot to run agents. The
    worker process serves `[workers] live_wait_s` with half its slots (`serve`); a job that
    finds them all taken ends as a job without a live wait does, and its round resumes through
    a resume job. Jobs run anywhere else (tests, `broker.testing`) wait only as their agent says.
    """

    def __init__(self, default_s: float = 0.0, most: int | None = None) -> None:
        self.default_s = default_s
        self.most = most
        self._waiting = 0
        self._lock = threading.Lock()

    def seconds(self, configured: float | None) -> float:
        """How long a job of an agent with `live_wait_s = configured` (None: unset) waits."""
        return self.default_s if configured is None else configured

    @contextlib.contextmanager
    def place(self) -> Iterator[bool]:
        """Take one of the places to wait in, for the block: True if there was one."""
        with self._lock:
            free = self.most is None or self._waiting < self.most
            if free:
                self._waiting += 1
        try:
            yield free
        finally:
            if free:
                with self._lock:
                    self._waiting -= 1


_served = LiveWaits()


def serve(waits: LiveWaits | None) -> None:
    """Make `waits` this process's (the worker process, at start); None: back to the default
    (an agent's own `live_wait_s`, no limit)."""
    global _served
    _served = waits or LiveWaits()


def served() -> LiveWaits:
    return _served


def claim_field(round_no: int) -> str:
    return f"claimed:{round_no}"


def live_field(round_no: int) -> str:
    """Until when (epoch seconds) a live job waits for the round: the resumer's claim step
    leaves a completed round nobody claimed alone until then, so the waiting job gets to go on
    with it (it only needs its claim; the resumer, woken by the same outcome, might win)."""
    return f"live_until:{round_no}"


def live_deadline(round_no: int, until: float) -> dict[str, str]:
    """The run's field that says a live job waits for round `round_no` until `until` (epoch s)."""
    return {live_field(round_no): f"{until:.6f}"}


def owned_round(fields: dict[str, str], round_no: int) -> int:
    """The round a job for `round_no` is really on: later rounds it went on with live count."""
    current = int(fields.get("round") or 0)
    while round_no < current and fields.get(claim_field(round_no + 1)) == LIVE:
        round_no += 1
    return round_no


def claimed_by(broker: Broker, run_id: str, round_no: int) -> str | None:
    owner = broker.redis.hget(broker.keys.run(run_id), claim_field(round_no))
    return as_str(owner)


def wait_and_claim(
    broker: Broker,
    run_id: str,
    round_no: int,
    timeout_s: float,
    *,
    until: float | None = None,
    request_ids: Sequence[str] | None = None,
) -> RoundRead | None:
    """Block until every call of the run's round has an outcome, and claim the round for this
    live job: what it goes on with (the run's hash, the round's requests), or None after
    `timeout_s` or when the round is someone else's (the resumer's, once the deadline passed).

    The wait's deadline goes on the run first (`live_deadline`), unless `until` says the
    caller wrote it already (the runner, with the pause: a decision that completes the round
    always sees it), and then the wait ends at `until`; `request_ids`, the round's, when the
    caller has them (else read). The claim is tried again only when the process's reader
    (`_Reader`) saw an event naming one of the round's requests, or every `BLOCK_S` whatever
    happened (a reader that lost Redis for a while costs a waiter at most that); a try while a
    call still waits writes nothing (`RunStore.claim_round`).
    """
    keys = broker.keys.of_run(run_id)  # the round's requests announce in the run's partition
    if until is None or request_ids is None:
        pipe = broker.redis.pipeline(transaction=False)
        if until is None:
            pipe.hset(
                broker.keys.run(run_id),
                mapping=as_fields(live_deadline(round_no, time.time() + timeout_s)),
            )
        pipe.lrange(broker.keys.run_round(run_id, round_no), 0, -1)
        request_ids = [as_str(i) for i in pipe.execute()[-1]]
    else:
        timeout_s = until - time.time()
    mine = [i.encode() for i in request_ids]
    field = claim_field(round_no)
    woken = threading.Event()
    reader = _reader(broker, keys.at, [keys.stream(q) for q in broker.config.queues])
    reader.watch(mine, woken)  # from here on, an outcome announced wakes this wait
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            woken.clear()
            claim = broker.run_store.claim_round(run_id, round_no, field, LIVE)
            if claim.state != "pending":
                return claim.read
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            woken.wait(min(left, BLOCK_S))
    finally:
        reader.unwatch(mine, woken)


class _Reader:
    """One partition's announcements, read for every live wait of this process at once.

    A wait per slot reading the streams itself woke every waiting slot on every event of the
    partition (N waits: N XREADs and N wake-ups per event, however few were theirs); one reader
    thread per process and partition reads each event once and wakes only the waits whose
    requests it names. It starts with the first wait (its stream positions fixed before that
    wait checks the pending set, so no outcome slips between) and ends when none is left.
    """

    def __init__(self, redis: Redis, streams: list[str]) -> None:
        self.redis = redis  # not the Broker: the registry's key must not be kept alive by it
        self.streams = streams
        self.lock = threading.Lock()
        self.waits: dict[bytes, set[threading.Event]] = {}
        self.positions: dict[KeyT, StreamIdT] = {}
        self.running = False

    def watch(self, ids: list[bytes], woken: threading.Event) -> None:
        with self.lock:
            for rid in ids:
                self.waits.setdefault(rid, set()).add(woken)
            if not self.running:
                pipe = self.redis.pipeline(transaction=False)
                for stream in self.streams:
                    pipe.xrevrange(stream, count=1)
                self.positions = {
                    s: rows[0][0] if rows else b"0-0"
                    for s, rows in zip(self.streams, pipe.execute(), strict=True)
                }
                self.running = True
                threading.Thread(target=self._read, name="live-wait-reader", daemon=True).start()

    def unwatch(self, ids: list[bytes], woken: threading.Event) -> None:
        with self.lock:
            for rid in ids:
                events = self.waits.get(rid)
                if events is not None:
                    events.discard(woken)
                    if not events:
                        del self.waits[rid]

    def _read(self) -> None:
        block_ms = int(BLOCK_S * 1000)
        while True:
            with self.lock:
                if not self.waits:
                    self.running = False
                    return
                positions = dict(self.positions)
            try:
                got = as_streams(self.redis.xread(positions, count=500, block=block_ms))
            except Exception as exc:  # noqa: BLE001 - the waits check their round every BLOCK_S
                with self.lock:  # meanwhile; a client closed under the last wait ends the reader
                    if not self.waits:
                        self.running = False
                        return
                log.warning("live waits: reading the announcements failed (%s)", exc)
                time.sleep(BLOCK_S)
                continue
            with self.lock:
                for name, entries in got:
                    self.positions[name.decode()] = entries[-1][0]
                    for _, fields in entries:
                        for woken in self.waits.get(fields.get(b"request_id") or b"", ()):
                            woken.set()


_readers: weakref.WeakKeyDictionary[Broker, dict[int, _Reader]] = weakref.WeakKeyDictionary()
_readers_lock = threading.Lock()


def _reader(broker: Broker, partition: int, streams: list[str]) -> _Reader:
    with _readers_lock:
        mine = _readers.setdefault(broker, {})
        if partition not in mine:
            mine[partition] = _Reader(broker.redis, streams)
        return mine[partition]
