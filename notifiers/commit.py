"""Writes what deliveries did back to Redis in batches: done markers, history, counters, acks.

One thread owns every Job's bookkeeping, so "all channels done, acknowledge" is decided in one
place. A batch goes out as one pipeline; an entry is acknowledged only after its channels are
done (or dead-lettered), and in the same pipeline as its last done marker.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from redis.exceptions import RedisError

from broker.client import Broker
from broker.keys import NOTIFIER_GROUP
from broker.models import HistoryEntry, utcnow
from notifiers.jobs import Job
from notifiers.outcomes import Kind, Outcome

log = logging.getLogger("notifiers")

MAX_BATCH = 1000


@dataclass
class Plan:
    """The Redis writes of one batch, computed once so a failed write can be repeated as is."""

    done: list[tuple[str, str]] = field(default_factory=list)  # (request id, field)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (request id, entry JSON)
    stats: Counter[str] = field(default_factory=Counter)
    acks: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    acked: list[Job] = field(default_factory=list)


class Committer:
    def __init__(self, broker: Broker, on_acked: Callable[[list[Job]], None]) -> None:
        self.broker = broker
        self.on_acked = on_acked
        self._queue: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="notify-commit", daemon=True)
        self._thread.start()

    def put(self, outcome: Outcome) -> None:
        self._queue.put(outcome)

    def close(self, timeout: float = 10.0) -> None:
        """Write everything reported so far, then stop."""
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            plan = self.plan(batch)
            delay = 0.1
            while True:
                try:
                    self.write(plan)
                    break
                except RedisError:
                    if self._stop.is_set() and delay > 2:
                        log.error("giving up writing %d outcomes: Redis is down", len(batch))
                        break
                    log.warning("cannot write delivery outcomes; retrying", exc_info=True)
                    self._stop.wait(delay)
                    delay = min(delay * 2, 5.0)
            if plan.acked:
                self.on_acked(plan.acked)

    def plan(self, batch: list[Outcome]) -> Plan:
        plan = Plan()
        now = utcnow()
        for outcome in batch:
            job = outcome.job
            if outcome.kind is Kind.attempt_failed:
                plan.stats[f"failed:{outcome.channel_kind}"] += 1
                continue
            if outcome.kind is Kind.delivered:
                plan.stats[f"delivered:{outcome.channel_kind}"] += 1
                plan.notes.append(
                    (job.event.request_id, _note(now, "delivered", outcome.channel, outcome.note))
                )
            elif outcome.kind is Kind.dead:
                plan.notes.append(
                    (
                        job.event.request_id,
                        _note(now, "delivery_failed", outcome.channel, outcome.note),
                    )
                )
            if outcome.channel is not None:
                job.remaining.discard(outcome.channel)
                if job.remaining and outcome.kind in (Kind.delivered, Kind.nothing):
                    plan.done.append((job.event.request_id, job.event.done_field(outcome.channel)))
            if not job.remaining and not job.acked:
                job.acked = True
                plan.acks[job.event.stream].append(job.event.entry_id)
                plan.acked.append(job)
        return plan

    def write(self, plan: Plan) -> None:
        keys = self.broker.keys
        pipe = self.broker.redis.pipeline(transaction=False)
        for request_id, done_field in plan.done:
            pipe.hset(keys.delivery(request_id), done_field, "1")
        for request_id, entry in plan.notes:
            self.broker.scripts.note(args=[keys.prefix, request_id, entry], client=pipe)
        for name, count in plan.stats.items():
            pipe.hincrby(keys.stats, name, count)
        for stream, ids in plan.acks.items():
            pipe.xack(stream, NOTIFIER_GROUP, *ids)
        if len(pipe):
            pipe.execute()


def _note(now: datetime, event: str, channel: str | None, detail: str | None) -> str:
    entry = HistoryEntry(at=now, event=event, channel=channel, detail=detail)
    return entry.model_dump_json(exclude_none=True)
