"""The consumer loop: read every handler queue's stream through the `notifiers` group, route each
event to its channels, acknowledge when all have it, and reclaim what dead consumers left.

Threads: this reader; a heartbeat that keeps our in-flight entries from looking abandoned;
the dispatcher's per-channel pools and timer; the committer. Entries are at-least-once: a crash
between delivering and acknowledging means a redelivery, which the `done:` markers and the
remembered Slack messages make harmless.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections import defaultdict
from typing import Any

from redis.exceptions import RedisError, ResponseError

from broker.client import Broker
from broker.keys import NOTIFIER_GROUP
from broker.models import Request
from notifiers.base import Channel
from notifiers.commit import Committer
from notifiers.dispatch import Dispatcher
from notifiers.events import OUTCOME_TYPES, Event, MalformedEntry, decode_fields, parse_entry
from notifiers.jobs import Job, Task
from notifiers.options import NotifierOptions
from notifiers.outcomes import Kind, Outcome

log = logging.getLogger("notifiers")

RawEntry = tuple[Any, Any]


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Notifier:
    """One notifier process's worth of consumers; `start()` it, `stop()` it."""

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
        self._cv = threading.Condition()
        self._stopping = threading.Event()
        self.committer = Committer(broker, self._acked)
        self.dispatcher = Dispatcher(channels, self.committer.put, self._dead_letter_task)
        self._threads: list[threading.Thread] = []

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> Notifier:
        self.ensure_groups()
        for target, name in ((self._read_loop, "notify-read"), (self._heartbeat, "notify-beat")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, grace_s: float | None = None) -> None:
        """Stop reading, give deliveries in flight `grace_s` to finish, then shut down.

        Whatever is unfinished stays pending in the group and another notifier reclaims it.
        """
        grace = self.options.shutdown_grace_s if grace_s is None else grace_s
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        deadline = time.monotonic() + grace
        with self._cv:
            while self.inflight and time.monotonic() < deadline:
                self._cv.wait(0.05)
        self.dispatcher.close()
        self.committer.close()
        for channel in self.channels.values():
            channel.close()

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
                    continue
                got = self.redis.xreadgroup(
                    NOTIFIER_GROUP,
                    self.name,
                    dict.fromkeys(self.streams, ">"),
                    count=min(self.options.batch, room),
                    block=self.options.block_ms,
                )
                for stream, entries in got or []:
                    self.handle(_text(stream), entries, claimed=False)
                backoff = 0.1
            except ResponseError as exc:
                if "NOGROUP" in str(exc):  # the stream or group was deleted under us
                    self._safely(self.ensure_groups)
                else:
                    log.exception("notifier %s: Redis refused a command", self.name)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except RedisError:
                log.warning("notifier %s: Redis unavailable; retrying", self.name, exc_info=True)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _room(self) -> int:
        """How many more entries we may take; waits (briefly) while we are full."""
        with self._cv:
            if len(self.inflight) >= self.options.max_inflight:
                self._cv.wait(0.2)
            return self.options.max_inflight - len(self.inflight)

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
                live = [(eid, f) for eid, f in claimed if eid is not None and f is not None]
                if len(live) < len(claimed):  # Redis 6.2 returns deleted entries as nil
                    self._drop_deleted(stream)
                live = [e for e in live if (stream, _text(e[0])) not in self.inflight]
                if live:
                    taken += len(live)
                    self.handle(stream, self._over_delivered(stream, live), claimed=True)
                if _text(cursor) == "0-0":
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
                    _text(eid),
                    decode_fields(raw),
                    f"handed out {times} times and never acknowledged (does it crash notifiers?)",
                )
            else:
                keep.append((eid, raw))
        return keep

    def _drop_deleted(self, stream: str) -> None:
        """Acknowledge entries we own that were trimmed or deleted from the stream."""
        rows = self.redis.xpending_range(
            stream,
            NOTIFIER_GROUP,
            "-",
            "+",
            self.options.max_inflight + self.options.batch + 100,
            consumername=self.name,
        )
        ids = [_text(r["message_id"]) for r in rows]
        ids = [i for i in ids if (stream, i) not in self.inflight]
        if not ids:
            return
        pipe = self.redis.pipeline(transaction=False)
        for i in ids:
            pipe.xrange(stream, i, i)
        gone = [i for i, found in zip(ids, pipe.execute(), strict=True) if not found]
        if gone:
            self.redis.xack(stream, NOTIFIER_GROUP, *gone)

    # ---- routing -----------------------------------------------------------------------

    def handle(self, stream: str, entries: list[RawEntry], *, claimed: bool) -> None:
        """Turn raw entries into jobs and hand their deliveries to the dispatcher."""
        queue = self.streams[stream]
        events: list[Event] = []
        for eid, raw in entries:
            entry_id, fields = _text(eid), decode_fields(raw)
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
            with self._cv:
                self.inflight[(stream, event.entry_id)] = job
            if not todo:
                self.committer.put(Outcome(job, Kind.finished))
            for channel in todo:
                self.dispatcher.submit(Task(job, channel))

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
            rid: {_text(k) for k in keys} for rid, keys in zip(order, pipe.execute(), strict=True)
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
        """Re-claim our own in-flight entries now and then, so nobody takes them from a live us."""
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

    def _safely(self, call: Any) -> None:
        try:
            call()
        except RedisError:
            log.warning("notifier %s: Redis call failed", self.name, exc_info=True)
