"""Runs deliveries on per-channel thread pools, and brings failed ones back after their back-off.

Each channel has its own pool, so a slow or failing Slack never takes threads from webhooks;
a channel whose sender delivers on an event loop of its own (webhooks) has its attempts run
there instead (notifiers.on_loop), under the same states and limits.
Waiting for a retry holds no thread: the task sits in a timer heap until it is due.

Tasks can be parked (see notifiers.parking) at any point of their life. The lock below makes
parking and finishing exclusive: a task is either finished first (and not parked) or parked
first (and its result then settles the parked record, not the stream entry). A parked task
that was queued or waiting is released here and taken again from Redis when due; one that is
running keeps running under a lease that the heartbeat renews.

The lock is never held across a Redis call: every pool thread takes it, so a Redis stall
under it would stop every channel, the very thing parking is there to prevent.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace

from redis.exceptions import RedisError

from channels.retry import Defer, GiveUp, Retry, pause_delay
from channels.sender import Sender
from notifiers.on_loop import LoopDeliveries
from notifiers.parking import Parked, ParkedStore
from notifiers.pool import DeliveryPool
from notifiers.results import DeliveryResult, ResultKind
from notifiers.tasks import Task, TaskState
from notifiers.traced import delivery_span

log = logging.getLogger("notifiers")

MAX_DEFERS = 1000

DeadLetter = Callable[[Task, str], None]


class Dispatcher:
    """Per-channel pools, a retry timer, and the task states that parking and finishing share."""

    def __init__(
        self,
        channels: dict[str, Sender],
        report: Callable[[DeliveryResult], None],
        dead_letter: DeadLetter,
        store: ParkedStore,
    ) -> None:
        self.channels = channels
        self.report = report
        self.dead_letter = dead_letter
        self.store = store
        self.pools = {
            name: DeliveryPool(channel.concurrency, f"notify-{name}")
            for name, channel in channels.items()
        }
        self.on_loop = LoopDeliveries(self)  # the channels whose sender has an event loop
        self._lock = threading.Lock()  # task states, `_load`, `_held`
        self._load: Counter[str] = Counter()  # tasks handed to a pool and not through it yet
        self._held: dict[tuple[str, str], Task] = {}  # parked deliveries we work on
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._timer = threading.Thread(target=self._timer_loop, name="notify-timer", daemon=True)
        self._timer.start()

    # ---- scheduling ----------------------------------------------------------------------

    def submit(self, task: Task, delay: float = 0.0) -> None:
        with self._lock:
            if task.released:
                return
            if delay > 0:
                task.state, task.due = TaskState.waiting, time.monotonic() + delay
            else:
                task.state = TaskState.queued
                self._load[task.channel] += 1
        if delay <= 0:
            channel = self.channels[task.channel]
            loop = channel.event_loop()
            try:
                if loop is not None:  # a sender that delivers on its event loop: no thread
                    self.on_loop.submit(task, channel, loop)
                else:
                    self.pools[task.channel].submit(self._run, task)
            except RuntimeError:  # shutting down: the entry stays pending and is reclaimed
                with self._lock:
                    self._load[task.channel] -= 1
            return
        with self._cv:
            heapq.heappush(self._heap, (task.due, next(self._seq), task))
            self._cv.notify()

    def adopt(self, task: Task) -> None:
        """Run a parked delivery taken from the store (we hold its lease from now on)."""
        assert task.parked is not None
        with self._lock:
            self._held[(task.channel, task.parked)] = task
        self.submit(task)

    def load(self, channel: str) -> int:
        with self._lock:
            return self._load[channel]

    def held(self) -> dict[str, list[str]]:
        """Ids of the parked deliveries we work on, by channel (their leases need renewing)."""
        with self._lock:
            out: dict[str, list[str]] = defaultdict(list)
            for channel, task_id in self._held:
                out[channel].append(task_id)
            return dict(out)

    def _timer_loop(self) -> None:
        with self._cv:
            while not self._closed:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, _, task = heapq.heappop(self._heap)
                    self.submit(task)
                timeout = self._heap[0][0] - now if self._heap else None
                self._cv.wait(timeout)

    # ---- parking -------------------------------------------------------------------------

    def park(self, tasks: list[Task]) -> list[Task]:
        """Hand unfinished tasks on to the parked store; returns the ones parked.

        The records are written before this returns, so the caller may acknowledge entries
        whose remaining channels were all parked. Redis is only called with the lock released,
        so a stalled Redis holds up this call alone, never every channel's threads: the records
        are written leased to us (no one takes them meanwhile); then, under the lock, each task
        is parked unless it finished in between; then the records of finished tasks are removed
        and those of released tasks made due when they would have run here.
        """
        with self._lock:
            chosen = [
                t
                for t in tasks
                if t.state is not TaskState.done
                and t.parked is None
                and not t.released
                and not t.parking
            ]
            for t in chosen:
                t.parking = True
            records = [Parked.of(t.event, t.channel, t.attempts, t.defers) for t in chosen]
        if not chosen:
            return []
        try:
            self.store.park([(r, time.time() + self.store.lease_s) for r in records])
        except RedisError:
            log.warning("cannot park %d deliveries yet", len(chosen), exc_info=True)
            with self._lock:
                for t in chosen:
                    t.parking = False
            return []
        parked, due, finished = self._settle_parked(chosen, records)
        try:
            self.store.settle(due, finished)
        except RedisError:  # their leases lapse, then anyone takes them (a finished one twice)
            log.warning("cannot settle %d parked deliveries", len(chosen), exc_info=True)
        return parked

    def _settle_parked(
        self, chosen: list[Task], records: list[Parked]
    ) -> tuple[list[Task], list[tuple[Parked, float]], list[Parked]]:
        """Under the lock: which tasks are parked now, when the released ones are due, and the
        records of tasks that finished (and reported as their entry's) while being parked."""
        parked: list[Task] = []
        due: list[tuple[Parked, float]] = []
        finished: list[Parked] = []
        now_m, now_w = time.monotonic(), time.time()
        with self._lock:
            for t, record in zip(chosen, records, strict=True):
                t.parking = False
                if t.state is TaskState.done or t.released:
                    finished.append(record)
                    continue
                t.parked = record.id
                parked.append(t)
                if t.state is TaskState.running:  # ours until it ends (or we die)
                    self._held[(t.channel, record.id)] = t
                    continue
                t.released = True  # the store has it now; this copy is skipped
                when = now_w + max(0.0, t.due - now_m) if t.state is TaskState.waiting else now_w
                due.append((Parked.of(t.event, t.channel, t.attempts, t.defers), when))
        return parked, due, finished

    def later(self, task: Task, delay: float) -> None:
        """Try again in `delay` seconds: here, or (a parked task) by whoever takes it when due."""
        with self._lock:
            parked = task.parked
            if parked is not None:
                task.released, task.state = True, TaskState.done
                self._held.pop((task.channel, parked), None)
        if parked is None:
            self.submit(task, delay)
            return
        record = Parked.of(task.event, task.channel, task.attempts, task.defers)
        record = replace(record, id=parked)  # the id it is stored under, whoever made it
        try:
            self.store.reschedule(record, time.time() + delay)
        except RedisError:  # its lease lapses and someone takes it again, one try short
            log.warning("%s: cannot reschedule parked %s", task.channel, parked, exc_info=True)

    # ---- running -------------------------------------------------------------------------

    def _run(self, task: Task) -> None:
        try:
            if self.start(task):
                self._attempt(task)
        finally:
            self.ran(task)

    def start(self, task: Task) -> bool:
        """Mark `task` running as its attempt begins; False when it was released (parked)."""
        with self._lock:
            if task.released:
                return False
            task.state = TaskState.running
            return True

    def ran(self, task: Task) -> None:
        """`task` is through its channel's pool (or loop) again."""
        with self._lock:
            self._load[task.channel] -= 1

    def _attempt(self, task: Task) -> None:
        channel = self.channels[task.channel]
        wait = channel.not_before - time.monotonic()
        if wait > 0:  # the far end asked for a pause: not an attempt
            self.later(task, pause_delay(wait))
            return
        try:
            with delivery_span(task, channel.kind):
                note = channel.deliver(task)
        except Exception as exc:  # noqa: BLE001 - every failure is settled below
            self.settle(task, channel, exc)
        else:
            self.finish(task, channel, note)

    def finish(self, task: Task, channel: Sender, note: str | None) -> None:
        """An attempt that succeeded: `note` for the history (None: nothing needed doing)."""
        self._finish(
            task, channel, ResultKind.nothing if note is None else ResultKind.delivered, note
        )

    def settle(self, task: Task, channel: Sender, exc: Exception) -> None:
        """An attempt that raised `exc`: deferred, retried later, or given up (may call Redis:
        off an event loop)."""
        if isinstance(exc, Defer):
            task.defers += 1
            if task.defers <= MAX_DEFERS:
                self.later(task, exc.delay)
                return
            self._failed(task, channel, f"still waiting after {MAX_DEFERS} tries: {exc}", None)
        elif isinstance(exc, GiveUp):
            task.attempts += 1
            self._give_up(task, channel, str(exc))
        elif isinstance(exc, Retry):
            self._failed(task, channel, str(exc), exc.retry_after)
        else:  # a bug or Redis trouble: retried like any failure
            log.warning(
                "%s: %s failed unexpectedly",
                task.channel,
                task.event.request_id,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
            self._failed(task, channel, f"{type(exc).__name__}: {exc}", None)

    def _finish(self, task: Task, channel: Sender, kind: ResultKind, note: str | None) -> None:
        with self._lock:
            task.state = TaskState.done
            parked = task.parked
            if parked is not None:
                self._held.pop((task.channel, parked), None)
        self.report(
            DeliveryResult(task.entry, kind, task.channel, channel.kind, note, parked=parked)
        )

    def _failed(self, task: Task, channel: Sender, error: str, retry_after: float | None) -> None:
        task.attempts += 1
        self.report(
            DeliveryResult(
                task.entry,
                ResultKind.attempt_failed,
                task.channel,
                channel.kind,
                error,
                task.parked,
            )
        )
        if task.attempts >= channel.policy.max_attempts:
            self._give_up(task, channel, f"gave up after {task.attempts} attempts: {error}")
            return
        delay = channel.policy.delay(task.attempts, retry_after)
        log.info(
            "%s: %s attempt %d failed (%s); next in %.2fs",
            task.channel,
            task.event.request_id,
            task.attempts,
            error,
            delay,
        )
        self.later(task, delay)

    def _give_up(self, task: Task, channel: Sender, error: str) -> None:
        try:
            self.dead_letter(task, error)
        except RedisError:
            log.warning("%s: cannot write dead letter yet; retrying", task.channel, exc_info=True)
            self.later(task, channel.policy.delay(max(task.attempts, 1)))
            return
        log.warning("%s: %s dead-lettered: %s", task.channel, task.event.request_id, error)
        self._finish(task, channel, ResultKind.dead, error)

    def close(self) -> None:
        """Stop scheduling; let deliveries already running finish; drop waiting retries."""
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify_all()
        self.on_loop.close()
        for pool in self.pools.values():
            pool.shutdown()
        self._timer.join(timeout=5)
