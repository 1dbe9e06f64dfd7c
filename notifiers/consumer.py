"""The consumer loop: read every handler queue's stream through the `notifiers` group, route each
event to its channels, acknowledge when all have it, and reclaim what dead consumers left.

Threads: this reader; a heartbeat that keeps our in-flight entries (and the leases of parked
deliveries we work on) from looking abandoned; a poller that takes due parked deliveries; the
dispatcher's per-channel pools and timer; the committer. Entries are at-least-once: a crash
between delivering and acknowledging means a redelivery, which the `done:` markers and the
remembered Slack messages make harmless.

When `max_inflight` entries are in flight and some have waited longer than `park_after_s` (a
hung or failing channel), their unfinished deliveries are parked in Redis (notifiers.parking)
and the entries acknowledged, so the healthy channels keep flowing.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError, ResponseError

from broker.client import Broker
from broker.keys import NOTIFIER_GROUP
from broker.models import Request
from notifiers.base import Channel
from notifiers.commit import Committer
from notifiers.dispatch import Dispatcher
from notifiers.events import (
    OUTCOME_TYPES,
    Event,
    MalformedEntry,
    decode_fields,
    parse_entry,
    text,
)
from notifiers.jobs import Job, Task
from notifiers.options import NotifierOptions
from notifiers.outcomes import Kind, Outcome
from notifiers.parking import Parked, ParkedStore

log = logging.getLogger("notifiers")

RawEntry = tuple[Any, Any]
TRIMMED = "trimmed before delivery"


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Notifier:
    """One notifier process's worth of consumers; `start()` it, `stop()` it.

    `failed` is set (and the notifier stops) when its bookkeeping broke; `run_notifier` then
    exits non-zero so a supervisor restarts it, and its entries are reclaimed by others.
    """

    def __init__(
        self,
        broker: Broker,
        channels: dict[str, Channel],
        options: NotifierOptions | None = None,
        *,
        name: str | None = None,
    ) -> None:
        self.broker = broker
        self.redis = broker.redis
        self.options = options or NotifierOptions()
        self.name = name or self.options.name or default_name()
        self.channels = channels
        self.streams = {broker.keys.stream(q): q for q in broker.config.queues}
        self.inflight: dict[tuple[str, str], Job] = {}
        self.failed = threading.Event()
        self.error: str | None = None
        self._cv = threading.Condition()
        self._stopping = threading.Event()
        self._park_every = max(0.05, min(1.0, self.options.park_after_s / 2))
        self._next_park = 0.0
        self.store = ParkedStore(broker, lease_s=self.options.claim_idle_s)
        self.committer = Committer(broker, self._acked, self.store, self.fail)
        self.dispatcher = Dispatcher(
            channels, self.committer.put, self._dead_letter_task, self.store
        )
        self._threads: list[threading.Thread] = []

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> Notifier:
        self.ensure_groups()
        loops: list[tuple[Callable[[], None], str]] = [
            (self._read_loop, "notify-read"),
            (self._heartbeat, "notify-beat"),
            (self._parked_loop, "notify-parked"),
        ]
        for target, name in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, grace_s: float | None = None) -> None:
        """Stop reading, give deliveries in flight `grace_s` to finish, then shut down.

        Whatever is unfinished stays pending in the group (or parked) and another notifier
        takes it over.
        """
        grace = self.options.shutdown_grace_s if grace_s is None else grace_s
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        deadline = time.monotonic() + grace
        with self._cv:
            while self.inflight and time.monotonic() < deadline and not self.failed.is_set():
                self._cv.wait(0.05)
        self.dispatcher.close()
        self.committer.close()
        for channel in self.channels.values():
            channel.close()

    def fail(self, error: str) -> None:
        """Stop taking work: this notifier can no longer keep its books."""
        self.error = error
        self.failed.set()
        self._stopping.set()
        with self._cv:
            self._cv.notify_all()

    def ensure_groups(self) -> None:
        for stream in self.streams:
            self.broker.ensure_group(stream, NOTIFIER_GROUP)

    # ---- reading -----------------------------------------------------------------------

    def _read_loop(self) -> None:
        claim_every = max(0.05, min(self.options.claim_idle_s / 2, 5.0))
        next_claim = 0.0
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                if time.monotonic() >= next_claim:
                    self.claim_stale()
                    next_claim = time.monotonic() + claim_every
                room = self._room()
                if room <= 0:
                    self.park_old()
                    continue
                got = self.redis.xreadgroup(
                    NOTIFIER_GROUP,
                    self.name,
                    dict.fromkeys(self.streams, ">"),
                    count=min(self.options.batch, room),
                    block=self.options.block_ms,
                )
                for stream, entries in got or []:
                    self.handle(text(stream), entries, claimed=False)
                backoff = 0.1
                continue
            except ResponseError as exc:
                if "NOGROUP" in str(exc):  # the stream or group was deleted under us
                    self._safely(self.ensure_groups)
                else:
                    log.exception("notifier %s: Redis refused a command", self.name)
            except RedisError:
                log.warning("notifier %s: Redis unavailable; retrying", self.name, exc_info=True)
            except Exception:  # a bug: what we read stays pending and is reclaimed later
                log.exception("notifier %s: reading failed; going on", self.name)
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _room(self) -> int:
        """How many more entries we may take; waits (briefly) while we are full."""
        with self._cv:
            if len(self.inflight) >= self.options.max_inflight:
                self._cv.wait(0.2)
            return self.options.max_inflight - len(self.inflight)

    # ---- parking -----------------------------------------------------------------------

    def park_old(self) -> int:
        """Park the unfinished deliveries of entries in flight longer than `park_after_s`.

        Called while we are full, so a hung channel can't keep the others from new entries.
        Returns how many deliveries were parked.
        """
        now = time.monotonic()
        if now < self._next_park:
            return 0
        self._next_park = now + self._park_every
        with self._cv:
            old = [
                j for j in self.inflight.values() if now - j.started >= self.options.park_after_s
            ]
        parked = self.dispatcher.park([t for job in old for t in job.tasks])
        for task in parked:
            kind = self.channels[task.channel].kind
            self.committer.put(Outcome(task.job, Kind.handed_on, task.channel, kind))
        if parked:
            log.info("notifier %s: parked %d slow deliveries", self.name, len(parked))
        return len(parked)

    def _parked_loop(self) -> None:
        while not self._stopping.wait(self._park_every):
            try:
                self.take_parked()
            except RedisError:
                log.warning("notifier %s: cannot take parked deliveries", self.name, exc_info=True)
            except Exception:
                log.exception("notifier %s: taking parked deliveries failed", self.name)

    def take_parked(self) -> int:
        """Take due parked deliveries for channels with idle threads here."""
        taken = 0
        for name, channel in self.channels.items():
            if channel.not_before > time.monotonic():
                continue
            free = channel.concurrency - self.dispatcher.load(name)
            if free <= 0:
                continue
            rows = self.store.take(name, free)
            if rows:
                taken += self._adopt(name, rows)
        return taken

    def _adopt(self, channel: str, rows: list[tuple[str, str]]) -> int:
        records: list[tuple[Parked, Event]] = []
        for task_id, raw in rows:
            try:
                parked = Parked.load(channel, task_id, raw)
                records.append((parked, parked.event()))
            except MalformedEntry as exc:
                self.broker.dead_letter(channel, str(exc), extra={"parked": task_id})
                self.store.remove(channel, task_id)
        requests, problems = self._fetch({e.request_id for _, e in records})
        for parked, event in records:
            request = requests.get(event.request_id)
            if request is None:
                problem = problems.get(event.request_id, "it does not exist")
                self.broker.dead_letter(
                    channel,
                    f"cannot deliver request {event.request_id!r}: {problem}",
                    stream=event.stream,
                    entry=event.dead_letter_entry(),
                    extra={"channel": channel, "request_id": event.request_id},
                )
                self.store.remove(channel, parked.id)
                continue
            job = Job(event, request, remaining={channel})
            task = Task(job, channel, attempts=parked.attempts, defers=parked.defers)
            task.parked = parked.id
            job.tasks.append(task)
            self.dispatcher.adopt(task)
        return len(records)

    def claim_stale(self) -> int:
        """Take over entries that a dead consumer read and never acknowledged (XAUTOCLAIM)."""
        idle_ms = int(self.options.claim_idle_s * 1000)
        taken = 0
        for stream in self.streams:
            cursor: Any = "0-0"
            for _ in range(100):  # a bounded sweep per call; the cursor resumes next time
                room = self._room()
                if room <= 0 or self._stopping.is_set():
                    return taken
                reply = self.redis.xautoclaim(
                    stream,
                    NOTIFIER_GROUP,
                    self.name,
                    idle_ms,
                    cursor,
                    count=min(self.options.batch, room),
                )
                cursor, claimed = reply[0], reply[1]
                if len(reply) > 2 and reply[2]:  # Redis 7: deleted ones, already out of the PEL
                    self._trimmed(stream, [text(i) for i in reply[2]], ack=False)
                live = [(eid, f) for eid, f in claimed if eid is not None and f is not None]
                if len(live) < len(claimed):  # Redis 6.2 returns deleted entries as nil
                    self._drop_deleted(stream)
                live = [e for e in live if (stream, text(e[0])) not in self.inflight]
                if live:
                    taken += len(live)
                    self.handle(stream, self._over_delivered(stream, live), claimed=True)
                if text(cursor) == "0-0":
                    break
        return taken

    def _over_delivered(self, stream: str, entries: list[RawEntry]) -> list[RawEntry]:
        """Dead-letter entries handed out too often (a poison entry that kills its consumers)."""
        pipe = self.redis.pipeline(transaction=False)
        for eid, _ in entries:
            pipe.xpending_range(stream, NOTIFIER_GROUP, eid, eid, 1)
        keep: list[RawEntry] = []
        for (eid, raw), info in zip(entries, pipe.execute(), strict=True):
            times = int(info[0]["times_delivered"]) if info else 0
            if times > self.options.max_deliveries:
                self.reject(
                    stream,
                    text(eid),
                    decode_fields(raw),
                    f"handed out {times} times and never acknowledged (does it crash notifiers?)",
                )
            else:
                keep.append((eid, raw))
        return keep

    def _drop_deleted(self, stream: str) -> None:
        """Dead-letter and acknowledge entries we own that were trimmed or deleted unread."""
        rows = self.redis.xpending_range(
            stream,
            NOTIFIER_GROUP,
            "-",
            "+",
            self.options.max_inflight + self.options.batch + 100,
            consumername=self.name,
        )
        ids = [text(r["message_id"]) for r in rows]
        ids = [i for i in ids if (stream, i) not in self.inflight]
        if not ids:
            return
        pipe = self.redis.pipeline(transaction=False)
        for i in ids:
            pipe.xrange(stream, i, i)
        gone = [i for i, found in zip(ids, pipe.execute(), strict=True) if not found]
        if gone:
            self._trimmed(stream, gone, ack=True)

    def _trimmed(self, stream: str, ids: list[str], *, ack: bool) -> None:
        """Entries gone from the stream before any notifier delivered them: nothing is left to
        deliver or re-drive, but the loss is recorded where operators look."""
        log.warning("notifier %s: %d entries of %s %s", self.name, len(ids), stream, TRIMMED)
        for entry_id in ids:
            self.broker.dead_letter(
                "notifier",
                f"{TRIMMED}: entry {entry_id} of {stream} was gone when it was reclaimed",
                extra={"consumer": self.name, "entry_id": entry_id, "from_stream": stream},
            )
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(self.broker.keys.stats, "failed:entry", len(ids))
        if ack:
            pipe.xack(stream, NOTIFIER_GROUP, *ids)
        pipe.execute()

    # ---- routing -----------------------------------------------------------------------

    def handle(self, stream: str, entries: list[RawEntry], *, claimed: bool) -> None:
        """Turn raw entries into jobs and hand their deliveries to the dispatcher."""
        queue = self.streams[stream]
        events: list[Event] = []
        for eid, raw in entries:
            entry_id, fields = text(eid), decode_fields(raw)
            try:
                events.append(parse_entry(stream, queue, entry_id, fields))
            except MalformedEntry as exc:
                self.reject(stream, entry_id, fields, f"malformed entry: {exc}")
        if not events:
            return
        requests, problems = self._fetch({e.request_id for e in events})
        redo = {e.request_id for e in events if claimed or "event_id" in e.fields}
        done = self._done_fields(redo)
        for event in events:
            request = requests.get(event.request_id)
            if request is None:
                problem = problems.get(event.request_id, "it does not exist")
                self.reject(
                    stream,
                    event.entry_id,
                    event.fields,
                    f"cannot handle request {event.request_id!r}: {problem}",
                )
                continue
            seen = done.get(event.request_id, set())
            todo = [c for c in self.route(event, request) if event.done_field(c) not in seen]
            job = Job(event, request, remaining=set(todo))
            job.tasks = [Task(job, channel) for channel in todo]
            with self._cv:
                self.inflight[(stream, event.entry_id)] = job
            if not todo:
                self.committer.put(Outcome(job, Kind.finished))
            for task in job.tasks:
                self.dispatcher.submit(task)

    def route(self, event: Event, request: Request) -> list[str]:
        """The channels of the event's queue that want it, plus the request's callback webhook
        for its outcome."""
        queue = self.broker.config.queues.get(event.queue)
        names = list(queue.channels) if queue else []
        if request.callback and event.type in OUTCOME_TYPES:
            names.append(f"webhook:{request.callback}")
        out: list[str] = []
        for name in dict.fromkeys(names):
            channel = self.channels.get(name)
            if channel is not None and channel.wants(event):
                out.append(name)
        return out

    def _fetch(self, ids: set[str]) -> tuple[dict[str, Request], dict[str, str]]:
        """The requests the events point at; a request that won't load is reported, not raised."""
        try:
            return {r.id: r for r in self.broker.get_requests(ids)}, {}
        except RedisError:
            raise
        except Exception:  # one bad request: load them one by one to find it
            found: dict[str, Request] = {}
            problems: dict[str, str] = {}
            for rid in ids:
                try:
                    found[rid] = self.broker.get_request(rid)
                except RedisError:
                    raise
                except Exception as exc:
                    problems[rid] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return found, problems

    def _done_fields(self, request_ids: set[str]) -> dict[str, set[str]]:
        if not request_ids:
            return {}
        order = list(request_ids)
        pipe = self.redis.pipeline(transaction=False)
        for rid in order:
            pipe.hkeys(self.broker.keys.delivery(rid))
        return {
            rid: {text(k) for k in keys} for rid, keys in zip(order, pipe.execute(), strict=True)
        }

    # ---- giving up -----------------------------------------------------------------------

    def reject(self, stream: str, entry_id: str, fields: dict[str, str], error: str) -> None:
        """An entry no notifier can handle: dead-letter it with its error, and acknowledge it."""
        log.warning("notifier %s: dead-lettering %s %s: %s", self.name, stream, entry_id, error)
        entry = {**fields}
        entry.setdefault("event_id", entry_id)
        pipe = self.redis.pipeline(transaction=False)
        self.broker.dead_letter(
            "notifier", error, stream=stream, entry=entry, extra={"consumer": self.name}
        )
        pipe.hincrby(self.broker.keys.stats, "failed:entry", 1)
        pipe.xack(stream, NOTIFIER_GROUP, entry_id)
        pipe.execute()

    def _dead_letter_task(self, task: Task, error: str) -> None:
        event = task.event
        self.broker.dead_letter(
            task.channel,
            error,
            stream=event.stream,
            entry=event.dead_letter_entry(),
            extra={
                "channel": task.channel,
                "request_id": event.request_id,
                "event": event.type,
                "attempts": str(task.attempts),
            },
        )

    # ---- bookkeeping -------------------------------------------------------------------

    def _acked(self, jobs: list[Job]) -> None:
        with self._cv:
            for job in jobs:
                self.inflight.pop((job.event.stream, job.event.entry_id), None)
            self._cv.notify_all()

    def _heartbeat(self) -> None:
        """Re-claim our own in-flight entries now and then, so nobody takes them from a live us,
        and push the leases of the parked deliveries we work on ahead."""
        every = max(0.05, self.options.claim_idle_s / 3)
        while not self._stopping.wait(every):
            with self._cv:
                keys = list(self.inflight)
            by_stream: dict[str, list[str]] = defaultdict(list)
            for stream, entry_id in keys:
                by_stream[stream].append(entry_id)
            for stream, ids in by_stream.items():
                for i in range(0, len(ids), 500):
                    self._safely(
                        lambda s=stream, chunk=ids[i : i + 500]: self.redis.xclaim(
                            s, NOTIFIER_GROUP, self.name, 0, chunk, justid=True
                        )
                    )
            held = self.dispatcher.held()
            if held:
                self._safely(lambda h=held: self.store.renew(h))

    def _safely(self, call: Callable[[], Any]) -> None:
        try:
            call()
        except RedisError:
            log.warning("notifier %s: Redis call failed", self.name, exc_info=True)
        except Exception:
            log.exception("notifier %s: unexpected failure", self.name)
