"""Writes what deliveries did back to Redis in batches: done markers, history, counters, acks.

One thread owns every in-flight entry's bookkeeping, so "all channels done, acknowledge" is
decided in one place. A batch goes out as one pipeline; an entry is acknowledged only after each of its
channels is done, dead-lettered or durably parked, and never before its done markers.

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
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import orjson
from redis import Redis
from redis.commands.core import Script
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.domain.models import utcnow
from broker.facade import Broker
from broker.store.keys import NOTIFIER_GROUP
from broker.store.scripts import chain_source
from notifiers.parking import ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from notifiers.scripts import source
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
class Plan:
    """The Redis writes of one batch, computed once so a failed write can be repeated as is."""

    done: list[tuple[str, str]] = field(default_factory=list)  # (request id, field)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (request id, entry JSON)
    stats: Counter[str] = field(default_factory=Counter)
    acks: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    acked: list[InflightEntry] = field(default_factory=list)
    unpark: list[tuple[str, str]] = field(default_factory=list)  # (channel, parked task id)


class Committer:
    def __init__(
        self,
        broker: Broker,
        on_acked: Callable[[list[InflightEntry]], None],
        store: ParkedStore,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.broker = broker
        self.on_acked = on_acked
        self.store = store
        self.on_fatal = on_fatal
        single = isinstance(broker.redis, Redis) and broker.keys.partitions <= 1
        self._step = (
            broker.redis.register_script(chain_source() + source("commit")) if single else None
        )
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
        if self._step is not None and not plan.unpark:
            self._write_step(plan, self._step)
        else:
            self._write_pipeline(plan)

    def _write_step(self, plan: Plan, step: Script) -> None:
        """The batch as one step (notifiers/scripts/commit.lua): one command, not about four per
        delivery; the same writes in the same order as `_write_pipeline`."""
        keys = self.broker.keys
        names = [keys.delivery(rid) for rid, _ in plan.done]
        names += [keys.request(rid) for rid, _ in plan.notes]
        args: list[str | int] = [NOTIFIER_GROUP, len(plan.done), len(plan.notes)]
        args += [len(plan.stats), len(plan.acks)]
        args += [done_field for _, done_field in plan.done]
        args += [entry for _, entry in plan.notes]
        if plan.stats:
            names.append(keys.stats)
            for name, count in plan.stats.items():
                args += [name, count]
        for stream, ids in plan.acks.items():
            names.append(stream)
            args.append(len(ids))
            args += ids
        if len(names) == 0:
            return
        if keys.audit_keep_s and plan.notes:  # each delivery note also goes to the audit trail
            names += [keys.audit, keys.audit_head]
            args += [keys.audit_keep_s, *(rid for rid, _ in plan.notes)]
        refused, first = step(keys=names, args=args)
        if int(refused):
            log.error(
                "Redis refused %d delivery bookkeeping writes (dropped, not repeated): %s",
                int(refused),
                first.decode() if isinstance(first, bytes) else first,
            )

    def _write_pipeline(self, plan: Plan) -> None:
        keys = self.broker.keys
        pipe = self.broker.redis.pipeline(transaction=False)
        for request_id, done_field in plan.done:
            pipe.hset(keys.delivery(request_id), done_field, "1")
        for request_id, entry in plan.notes:
            self.broker.requests.add_delivery_note(request_id, entry, pipe=pipe)
        for name, count in plan.stats.items():
            pipe.hincrby(keys.stats, name, count)
        for channel, task_id in plan.unpark:
            self.store.remove(channel, task_id, pipe)
        for stream, ids in plan.acks.items():
            pipe.xack(stream, NOTIFIER_GROUP, *ids)
        if not len(pipe):
            return
        results = pipe.execute(raise_on_error=False)
        refused = [r for r in results if isinstance(r, Exception)]
        if refused:
            log.error(
                "Redis refused %d of %d delivery bookkeeping writes (dropped, not repeated): %s",
                len(refused),
                len(results),
                refused[0],
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
