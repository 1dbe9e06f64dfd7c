"""Writes what deliveries did back to Redis in batches: done markers, history, counters, acks.

One thread owns every in-flight entry's bookkeeping, so "all channels done, acknowledge" is
decided in one place. A batch goes out in one round trip (`broker.commits`: one Lua step on a
single Redis, else one pipeline); an entry is acknowledged only after each of its channels is
done, dead-lettered or durably parked, and never before its done markers.

A batch is repeated only when the connection failed (Redis down: nothing can be acked anyway).
A command Redis refuses is logged and dropped, not repeated: repeating the whole batch would
add its history notes and counters twice, and a refusal that never goes away would stop every
acknowledgement for good. Anything else going wrong here is a bug that leaves the books in an
unknown state, so the notifier is stopped (`on_fatal`) and its entries go to another.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.domain.models import utcnow
from broker.facade import Broker, CommitBatch
from notifiers.parking import ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from notifiers.tasks import InflightEntry

log = logging.getLogger("notifiers")

MAX_BATCH = 1000
LINGER_S = 0.003
"""How long the committer lets results gather after the first of a batch. Acknowledging is off
the delivery's path (the receiver has it already); a step per 1-2 results was a tenth of a busy
notifier's CPU, and entries wait this much longer for their XACK."""
TRANSIENT = (RedisConnectionError, RedisTimeoutError)
SETTLED = (ResultKind.delivered, ResultKind.nothing, ResultKind.dead)


@dataclass
class Plan(CommitBatch):
    """One batch's Redis writes (`CommitBatch`: done markers, notes, counters, settled parked
    deliveries, acks), computed once so a failed write can be repeated as is, and the entries
    it acknowledges."""

    acked: list[InflightEntry] = field(default_factory=list)


class Committer:
    def __init__(
        self,
        broker: Broker,
        on_acked: Callable[[list[InflightEntry]], None],
        store: ParkedStore,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.commits = broker.commits
        self.on_acked = on_acked
        self.store = store  # whose records a batch settles (`Plan.unpark`, in the batch's trip)
        self.on_fatal = on_fatal
        self._queue: queue.SimpleQueue[DeliveryResult] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="notify-commit", daemon=True)
        self._thread.start()

    def put(self, result: DeliveryResult) -> None:
        self._queue.put(result)

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
            if not self._stop.is_set():
                time.sleep(LINGER_S)  # let a batch gather: one step for many results
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                plan = self.plan(batch)
                self._write(plan)
            except Exception as exc:
                log.exception("the notifier's committer failed; stopping this notifier")
                self.on_fatal(f"committer failed: {type(exc).__name__}: {exc}")
                return
            if plan.acked:
                self.on_acked(plan.acked)

    def _write(self, plan: Plan) -> None:
        delay = 0.1
        while True:
            try:
                self.write(plan)
                return
            except TRANSIENT:
                if self._stop.is_set() and delay > 2:
                    log.error("giving up writing delivery results: Redis is down")
                    return
                log.warning("cannot write delivery results; retrying", exc_info=True)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def plan(self, batch: list[DeliveryResult]) -> Plan:
        plan = Plan()
        stamp = _stamp(utcnow())
        for result in batch:
            entry, kind, channel = result.entry, result.kind, result.channel
            if kind is ResultKind.attempt_failed:
                plan.stats[f"failed:{result.channel_kind}"] += 1
                continue
            if kind is ResultKind.delivered:
                plan.stats[f"delivered:{result.channel_kind}"] += 1
                plan.notes.append(
                    (entry.event.request_id, _note(stamp, "delivered", channel, result.note))
                )
            elif kind is ResultKind.dead:
                plan.notes.append(
                    (entry.event.request_id, _note(stamp, "delivery_failed", channel, result.note))
                )
            elif kind is ResultKind.handed_on:
                plan.stats[f"parked:{result.channel_kind}"] += 1
            if channel is not None and kind in (ResultKind.delivered, ResultKind.nothing):
                # always, even for the entry's last channel: a redriven or reclaimed copy of
                # the entry must skip every channel that already has it
                plan.done.append((entry.event.request_id, entry.event.done_field(channel)))
            if result.parked is not None:  # settles a parked record; the entry let go of it
                if channel is not None and kind in SETTLED:
                    plan.unpark.append((channel, result.parked))
                continue
            if channel is not None:
                entry.remaining.discard(channel)
            if not entry.remaining and not entry.acked:
                entry.acked = True
                plan.acks[entry.event.stream].append(entry.event.entry_id)
                plan.acked.append(entry)
        return plan

    def write(self, plan: Plan) -> None:
        """The batch in one round trip; a write Redis refuses is logged, dropped, not repeated."""
        refused = self.commits.write(plan)
        if refused is None:
            return
        if refused.of is None:
            log.error(
                "Redis refused %d delivery bookkeeping writes (dropped, not repeated): %s",
                refused.count,
                refused.first,
            )
        else:
            log.error(
                "Redis refused %d of %d delivery bookkeeping writes (dropped, not repeated): %s",
                refused.count,
                refused.of,
                refused.first,
            )


def _stamp(now: datetime) -> str:
    """`{"at":...` as pydantic writes it for `now` (orjson writes UTC times as it does): shared
    by every note of a batch."""
    return '{"at":' + orjson.dumps(now, option=orjson.OPT_UTC_Z).decode()


def _note(stamp: str, event: str, channel: str | None, detail: str | None) -> str:
    """`HistoryEntry(at, event, channel, detail).model_dump_json(exclude_none=True)`, the same
    text (tests/integration/test_notify_batches.py compares them), without building a model per delivery."""
    out = f'{stamp},"event":{_text(event)}'
    if channel is not None:
        out += f',"channel":{_text(channel)}'
    if detail is not None:
        out += f',"detail":{_json(detail)}'
    return out + "}"


@functools.lru_cache(maxsize=1024)
def _text(name: str) -> str:
    """An event or channel name as JSON (a handful of them, each encoded once)."""
    return _json(name)


def _json(text: str) -> str:
    """A string as pydantic writes it (orjson's escapes are serde's)."""
    try:
        return orjson.dumps(text).decode()
    except TypeError:  # a lone surrogate: written as before (and refused when sent)
        return _plain_json(text)


_plain_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
