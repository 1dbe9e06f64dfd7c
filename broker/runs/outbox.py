"""The outbox of fully answered rounds, and the step that turns each entry into one resume job.

Each entry is read through the consumer group `resumers`, its resume job is enqueued under the
deterministic id `resume-{run_id}-{round}` (never a second one: see `broker.runs.resume_step`), and
only then (or in the same EXEC) is the entry acknowledged. A resumer that dies after reading
leaves the entry pending; another one (or the same one restarted) claims it once it has been
idle for `min_idle_ms`, and enqueueing it again is a no-op, so a crash between any two steps
neither loses nor doubles a resume.

One bad entry can't stall the others: an error while handling an entry is logged and the entry
is left pending (it is claimed again later), while the rest of the batch goes on; an entry that
has been delivered `max_deliveries` times and still fails goes to the dead-letter stream with
its last error. New entries are read in the same pass as reclaimed ones, so a poison entry
never keeps them waiting.

New entries are handled as one batch (`broker.runs.resume_step`): the job keys WATCHed, one Lua step
that checks each run and claims its round (`HSETNX run:{id} claimed:N`, see `broker.runs.live_wait`)
and one MULTI/EXEC with RQ's own `enqueue_many` of the jobs that don't exist yet and the
entries' acknowledgement (on a Redis Cluster, where RQ has its own Redis, the acks follow the
EXEC). A round is never enqueued twice, and an entry is acknowledged only with or after its
job. An entry the batch can't take (reclaimed, malformed, its run gone)
or a batch that fails is handled entry by entry.

A second outbox, `resumes_direct`, holds the rounds whose deciding API process enqueues the
resume itself (`broker.runs.direct_resume`) and then deletes the entry. The resumers read it
too, without blocking, every `DIRECT_POLL_S`, and take an entry only once it is
`DIRECT_GRACE_S` old: what is still there then is a round whose API died between its step and
its enqueue (the same claim, WATCH and unique job id make it exactly once).

The `approval-broker resumer` role (workers/resumer.py) runs this in a loop; `broker.testing`
runs it in-process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from redis.exceptions import ResponseError
from rq import Queue

from broker.facade import Broker
from broker.redis.replies import as_pending, as_str, as_str_dict, as_streams
from broker.runs.resume_step import ClaimStep, Handled, Round, resume_batch
from broker.runs.starting import run_queue
from broker.store import streams
from broker.store.keys import RESUMER_GROUP

log = logging.getLogger("broker.runs.outbox")

DEFER_S = 0.2
"""How often a round left to a live job still waiting is looked at again (it is claimed by
then, or its wait ended and the resumer takes it)."""
POLL_S = 0.05  # on a cluster, the pause after a round of outbox reads that found nothing
DIRECT_GRACE_S = 1.0
"""How old an entry of `resumes_direct` must be before a resumer takes it: the API that wrote
it enqueues its job and deletes it within milliseconds, so what is older was left by an API
that died (or is stuck). A younger one read meanwhile is looked at again when it is that old."""
DIRECT_POLL_S = 0.5
"""How often the resumers read `resumes_direct` (without blocking: nothing there is due at once;
while `resumes` is quiet, its blocking read may make it up to `block_ms` later)."""


def default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Resumer:
    """Reads the outbox through a consumer group and enqueues one resume job per round."""

    def __init__(
        self,
        broker: Broker,
        *,
        consumer: str | None = None,
        min_idle_ms: int = 30_000,
        block_ms: int | None = 1000,
        count: int = 100,
        max_deliveries: int = 5,
        partition: int = 0,
        direct: bool = False,
        grace_s: float = DIRECT_GRACE_S,
    ) -> None:
        """Reads one partition's outbox (`broker.store.keys`); `run_forever` reads every one.
        `direct`: its `resumes_direct` instead, taking entries once `grace_s` old."""
        self.broker = broker
        self.partition = partition
        self.consumer = consumer or default_consumer()
        self.min_idle_ms = min_idle_ms
        self.block_ms = block_ms
        self.count = count
        self.max_deliveries = max_deliveries
        self.direct = direct
        self.grace_s = grace_s
        keys = broker.keys.part(partition)
        self.stream = keys.resumes_direct if direct else keys.resumes
        self._group_ready = False
        self._claimed: set[str] = set()
        self._queue: Queue | None = None
        self._next_claim = 0.0
        self._step: ClaimStep | None = None
        self._deferred: dict[str, tuple[dict[str, str], float]] = {}
        """Entries the step left to a live job still waiting (id -> fields, when to look again)."""

    @property
    def queue(self) -> Queue:
        """The RQ queue, made once (RQ asks Redis for its version once per Queue object)."""
        if self._queue is None:
            self._queue = run_queue(self.broker)
        return self._queue

    def step(self) -> ClaimStep:
        """The batch's claim step (`broker.runs.resume_step`), on the broker's Redis."""
        if self._step is None:
            self._step = ClaimStep(self.broker.redis)
        return self._step

    def _ensure_group(self) -> None:
        if not self._group_ready:
            self.broker.ensure_group(self.stream, RESUMER_GROUP)
            self._group_ready = True

    def read(self) -> list[tuple[str, dict[str, str]]]:
        """Entries a dead resumer left behind, then new ones (waits up to `block_ms` if none)."""
        redis = self.broker.redis
        self._ensure_group()
        entries: list[Any] = []
        try:
            if time.monotonic() >= self._next_claim:  # nothing goes idle faster than min_idle
                claimed = redis.xautoclaim(
                    self.stream, RESUMER_GROUP, self.consumer, self.min_idle_ms, "0-0",
                    count=self.count,
                )  # fmt: skip
                entries = list(claimed[1])  # Redis 6.2 returns 2 items, 7.x returns 3
                self._next_claim = time.monotonic() + min(self.min_idle_ms / 2000, 5.0)
            got = as_streams(
                redis.xreadgroup(
                    RESUMER_GROUP,
                    self.consumer,
                    {self.stream: ">"},
                    count=self.count,
                    block=None if entries else self._block_ms(),
                )
            )
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                self._group_ready = False  # the stream or group was deleted: create it again
            raise
        self._claimed = {as_str(eid) for eid, _ in entries if eid is not None}
        if any(eid is None for eid, _ in entries):
            self._drop_deleted()
        entries += self._old_enough(list(got[0][1]) if got else [])
        out: list[tuple[str, dict[str, str]]] = []
        for eid, f in entries:
            if eid is None:
                continue
            if f is None:  # deleted from the stream while pending: nothing to resume
                self.ack(as_str(eid))
            else:
                out.append((as_str(eid), as_str_dict(f)))
        return out + self._due_deferred({eid for eid, _ in out})

    def _old_enough(self, fresh: list[Any]) -> list[Any]:
        """New entries to handle now: all of them, except on `resumes_direct`, where one not
        yet `grace_s` old is its API's to finish: it is looked at again once it is (by then it
        is gone, or its API died)."""
        if not self.direct:
            return fresh
        now_wall, now = time.time(), time.monotonic()
        out = []
        for eid, f in fresh:
            left = int(as_str(eid).partition("-")[0]) / 1000 + self.grace_s - now_wall
            if left > 0 and f is not None:
                self._deferred[as_str(eid)] = (as_str_dict(f), now + left)
            else:
                out.append((eid, f))
        return out

    def _block_ms(self) -> int | None:
        """How long the read may block: `block_ms`, but no later than a deferred entry is due."""
        if not self._deferred or self.block_ms is None:
            return self.block_ms
        due = min(at for _, at in self._deferred.values())
        return max(1, min(self.block_ms, int((due - time.monotonic()) * 1000)))

    def _due_deferred(self, read: set[str]) -> list[tuple[str, dict[str, str]]]:
        """Deferred entries due for another look (ones read again anyway are dropped here)."""
        now = time.monotonic()
        due = [(eid, f) for eid, (f, at) in self._deferred.items() if at <= now or eid in read]
        for eid, _ in due:
            del self._deferred[eid]
        return [(eid, f) for eid, f in due if eid not in read]

    def _drop_deleted(self) -> None:
        """Acknowledge this consumer's pending entries that were deleted from the stream.

        Redis 6.2 hands such an entry back from XAUTOCLAIM as (None, None), without its id, so it
        would be claimed (and take a slot of the batch) for ever; XPENDING still knows the id.
        """
        redis = self.broker.redis
        rows = as_pending(
            redis.xpending_range(
                self.stream,
                RESUMER_GROUP,
                min="-",
                max="+",
                count=self.count,
                consumername=self.consumer,
            )
        )
        for row in rows:
            eid = row["message_id"]
            if not redis.xrange(self.stream, eid, eid):
                redis.xack(self.stream, RESUMER_GROUP, eid)
                log.info("outbox entry %s was deleted while pending; acknowledged", as_str(eid))

    def deliveries(self, entry_id: str) -> int:
        """How many times the group has handed this entry out (XPENDING), 0 if not pending."""
        rows = self.broker.redis.xpending_range(
            self.stream, RESUMER_GROUP, min=entry_id, max=entry_id, count=1
        )
        return int(rows[0]["times_delivered"]) if rows else 0

    def handle_safely(
        self, entry_id: str, fields: dict[str, str], *, claimed: bool = False
    ) -> Handled:
        """`handle`, but an error leaves the entry pending (or dead-letters it at the limit).

        A `claimed` entry (one another consumer held) that has been handed out more than
        `max_deliveries` times is dead-lettered without another try: whatever handles it may
        be what keeps killing resumers, so it is never seen failing.
        """
        try:
            if claimed and self.deliveries(entry_id) > self.max_deliveries:
                return self._give_up(entry_id, fields, "it was never acknowledged")
            return self.handle(entry_id, fields)
        except Exception as exc:  # noqa: BLE001 - one bad entry must not stop the batch
            error = f"{type(exc).__name__}: {exc}"
            run_id = fields.get("run_id")
            try:
                if self.deliveries(entry_id) >= self.max_deliveries:
                    return self._give_up(entry_id, fields, f"last error: {error}")
            except Exception:  # noqa: BLE001 - it stays pending and is claimed again
                log.exception("outbox entry %s: could not check or dead-letter it", entry_id)
            log.warning("outbox entry %s failed (%s); it will be claimed again", entry_id, error)
            return Handled(entry_id, run_id, None, "failed")

    def handle(self, entry_id: str, fields: dict[str, str]) -> Handled:
        """Enqueue the resume of one entry and acknowledge it (a batch of one)."""
        run_id = fields.get("run_id")
        raw_round = fields.get("round", "")
        if not run_id or not raw_round.isdigit():
            self.broker.dead_letter(
                "resumer",
                f"malformed outbox entry (needs run_id and a round number): {fields!r}",
                stream=self.stream,
                entry=fields,
            )
            self.ack(entry_id)
            return Handled(entry_id, run_id, None, "dead-lettered")
        round_no = int(raw_round)
        done = self.handle_batch([(entry_id, fields)])
        if not done:  # its run is gone
            self.broker.dead_letter(
                "resumer", f"run {run_id} does not exist", stream=self.stream, entry=fields
            )
            self.ack(entry_id)
            return Handled(entry_id, run_id, round_no, "dead-lettered")
        return done[0]

    def ack(self, entry_id: str) -> None:
        streams.ack_and_delete(self.broker.redis, self.stream, RESUMER_GROUP, entry_id)

    def per_partition(self) -> list[Resumer]:
        """This resumer, or on a cluster one per partition, none blocking in its read."""
        if self.broker.keys.partitions <= 1:
            return [self]
        return [self._sibling(p, direct=False) for p in range(self.broker.keys.partitions)]

    def direct_readers(self) -> list[Resumer]:
        """A reader of each partition's `resumes_direct` (never blocking), for `run_forever`."""
        return [self._sibling(p, direct=True) for p in range(self.broker.keys.partitions)]

    def _sibling(self, partition: int, *, direct: bool) -> Resumer:
        return Resumer(
            self.broker,
            consumer=self.consumer,
            min_idle_ms=self.min_idle_ms,
            block_ms=None,
            count=self.count,
            max_deliveries=self.max_deliveries,
            partition=partition,
            direct=direct,
            grace_s=self.grace_s,
        )

    def run_once(self) -> list[Handled]:
        """Read one batch; handle its new entries together, the rest each on its own."""
        entries = self.read()
        done: dict[str, Handled] = {}
        fresh = [(eid, f) for eid, f in entries if eid not in self._claimed and _well_formed(f)]
        if fresh:
            try:
                done = {h.entry_id: h for h in self.handle_batch(fresh)}
            except Exception:  # noqa: BLE001 - each entry is tried alone below
                log.warning(
                    "outbox batch of %d failed; handling each alone", len(fresh), exc_info=True
                )
        return [
            done.get(eid) or self.handle_safely(eid, fields, claimed=eid in self._claimed)
            for eid, fields in entries
        ]

    def handle_batch(self, entries: list[tuple[str, dict[str, str]]]) -> list[Handled]:
        """Claim and enqueue the rounds of well-formed new entries whose run exists, and ack them.

        Entries left out of the answer (their run is gone) are for `handle_safely`.
        """
        rounds: list[Round] = [(f["run_id"], int(f["round"])) for _, f in entries]
        out = resume_batch(self.broker, self.queue, self.step(), self.stream, entries, rounds)
        again = time.monotonic() + DEFER_S
        fields_of = dict(entries)
        for h in out:
            if h.action == "deferred":  # still pending: looked at again, or reclaimed if we die
                self._deferred[h.entry_id] = (fields_of[h.entry_id], again)
        if log.isEnabledFor(logging.INFO):
            for h in out:
                log.info("run %s round %s: resume %s", h.run_id, h.round, h.action)
        return out

    def _give_up(self, entry_id: str, fields: dict[str, str], why: str) -> Handled:
        delivered = self.deliveries(entry_id)
        self.broker.dead_letter(
            "resumer",
            f"outbox entry delivered {delivered} times without success; {why}",
            stream=self.stream,
            entry=fields,
        )
        self.ack(entry_id)
        log.error("outbox entry %s dead-lettered after %s deliveries: %s", entry_id, delivered, why)
        return Handled(entry_id, fields.get("run_id"), None, "dead-lettered")

    def run_forever(self, stop: threading.Event) -> None:
        """Read every partition's outbox until `stop`, and its `resumes_direct` every
        `DIRECT_POLL_S`; on a cluster, pause when all are empty."""
        each = self.per_partition()
        direct = self.direct_readers()
        next_direct = 0.0
        while not stop.is_set():
            try:
                busy = [bool(r.run_once()) for r in each]
                if time.monotonic() >= next_direct:
                    next_direct = time.monotonic() + DIRECT_POLL_S
                    busy += [bool(r.run_once()) for r in direct]
                if len(each) > 1 and not any(busy):
                    stop.wait(POLL_S)
            except Exception:  # noqa: BLE001 - a Redis hiccup must not end the loop
                log.exception("resumer: reading the outbox failed; retrying")
                stop.wait(1.0)


def _well_formed(fields: dict[str, str]) -> bool:
    return bool(fields.get("run_id")) and fields.get("round", "").isdigit()
