"""Parking slow deliveries and taking due ones back (the store itself is notifiers.parking).

While the notifier is full, the unfinished tasks of entries in flight longer than
`park_after_s` are parked and reported `handed_on`, so their entries can be acknowledged and
new ones read. A poller takes due parked deliveries for channels with idle threads here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from broker.domain.events import Event, MalformedEntry
from broker.facade import StoredRequest
from channels.sender import Sender
from notifiers.dead_letters import DeadLetters
from notifiers.dispatch import Dispatcher
from notifiers.inflight import Inflight
from notifiers.parking import Parked, ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from notifiers.tasks import InflightEntry, Task

log = logging.getLogger("notifiers")

Fetch = Callable[[set[str]], tuple[dict[str, StoredRequest], dict[str, str]]]


class Parker:
    def __init__(
        self,
        channels: dict[str, Sender],
        park_after_s: float,
        inflight: Inflight,
        dispatcher: Dispatcher,
        store: ParkedStore,
        report: Callable[[DeliveryResult], None],
        fetch: Fetch,
        dead_letters: DeadLetters,
    ) -> None:
        self.channels = channels
        self.park_after_s = park_after_s
        self.every = max(0.05, min(1.0, park_after_s / 2))
        self.inflight = inflight
        self.dispatcher = dispatcher
        self.store = store
        self.report = report
        self.fetch = fetch
        self.dead_letters = dead_letters
        self._next_park = 0.0

    def park_old(self) -> int:
        """Park the unfinished deliveries of entries in flight longer than `park_after_s`.

        Called while we are full, so a hung channel can't keep the others from new entries.
        Returns how many deliveries were parked.
        """
        now = time.monotonic()
        if now < self._next_park:
            return 0
        self._next_park = now + self.every
        old = self.inflight.older_than(self.park_after_s)
        parked = self.dispatcher.park([t for entry in old for t in entry.tasks])
        for task in parked:
            kind = self.channels[task.channel].kind
            self.report(DeliveryResult(task.entry, ResultKind.handed_on, task.channel, kind))
        if parked:
            log.info("parked %d slow deliveries", len(parked))
        return len(parked)

    def loop(self, stopping: threading.Event) -> None:
        """The poller thread: take due parked deliveries until `stopping` is set."""
        while not stopping.wait(self.every):
            try:
                self.take_parked()
            except RedisError:
                log.warning("cannot take parked deliveries", exc_info=True)
            except Exception:
                log.exception("taking parked deliveries failed")

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
                self.dead_letters.unreadable_parked(channel, task_id, str(exc))
                self.store.remove(channel, task_id)
        requests, problems = self.fetch({e.request_id for _, e in records})
        for parked, event in records:
            request = requests.get(event.request_id)
            if request is None:
                problem = problems.get(event.request_id, "it does not exist")
                error = f"cannot deliver request {event.request_id!r}: {problem}"
                self.dead_letters.parked(channel, event, error)
                self.store.remove(channel, parked.id)
                continue
            entry = InflightEntry(event, remaining={channel}, stored=request)
            task = Task(entry, channel, attempts=parked.attempts, defers=parked.defers)
            task.parked = parked.id
            entry.tasks.append(task)
            self.dispatcher.adopt(task)
        return len(records)
