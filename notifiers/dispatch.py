"""Runs deliveries on per-channel thread pools, and brings failed ones back after their back-off.

Each channel has its own pool, so a slow or failing Slack never takes threads from webhooks.
Waiting for a retry holds no thread: the task sits in a timer heap until it is due.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from redis.exceptions import RedisError

from notifiers.base import Channel
from notifiers.jobs import Task
from notifiers.outcomes import Kind, Outcome
from notifiers.retry import Defer, GiveUp, Retry

log = logging.getLogger("notifiers")

MAX_DEFERS = 1000

DeadLetter = Callable[[Task, str], None]


class Dispatcher:
    def __init__(
        self,
        channels: dict[str, Channel],
        report: Callable[[Outcome], None],
        dead_letter: DeadLetter,
    ) -> None:
        self.channels = channels
        self.report = report
        self.dead_letter = dead_letter
        self.pools = {
            name: ThreadPoolExecutor(
                max_workers=channel.concurrency, thread_name_prefix=f"notify-{name}"
            )
            for name, channel in channels.items()
        }
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._timer = threading.Thread(target=self._timer_loop, name="notify-timer", daemon=True)
        self._timer.start()

    def submit(self, task: Task, delay: float = 0.0) -> None:
        if delay <= 0:
            try:
                self.pools[task.channel].submit(self._run, task)
            except RuntimeError:  # shutting down: the entry stays pending and is reclaimed
                pass
            return
        with self._cv:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), task))
            self._cv.notify()

    def _timer_loop(self) -> None:
        with self._cv:
            while not self._closed:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    _, _, task = heapq.heappop(self._heap)
                    self.submit(task)
                timeout = self._heap[0][0] - now if self._heap else None
                self._cv.wait(timeout)

    def _run(self, task: Task) -> None:
        channel = self.channels[task.channel]
        wait = channel.not_before - time.monotonic()
        if wait > 0:  # the far end asked for a pause: not an attempt
            self.submit(task, wait)
            return
        try:
            note = channel.deliver(task)
        except Defer as exc:
            task.defers += 1
            if task.defers <= MAX_DEFERS:
                self.submit(task, exc.delay)
                return
            self._failed(task, channel, f"still waiting after {MAX_DEFERS} tries: {exc}", None)
        except GiveUp as exc:
            task.attempts += 1
            self._give_up(task, channel, str(exc))
        except Retry as exc:
            self._failed(task, channel, str(exc), exc.retry_after)
        except Exception as exc:  # a bug or Redis trouble: retried like any failure
            log.warning(
                "%s: %s failed unexpectedly", task.channel, task.event.request_id, exc_info=True
            )
            self._failed(task, channel, f"{type(exc).__name__}: {exc}", None)
        else:
            kind = Kind.nothing if note is None else Kind.delivered
            self.report(Outcome(task.job, kind, task.channel, channel.kind, note))

    def _failed(self, task: Task, channel: Channel, error: str, retry_after: float | None) -> None:
        task.attempts += 1
        self.report(Outcome(task.job, Kind.attempt_failed, task.channel, channel.kind, error))
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
        self.submit(task, delay)

    def _give_up(self, task: Task, channel: Channel, error: str) -> None:
        try:
            self.dead_letter(task, error)
        except RedisError:
            log.warning("%s: cannot write dead letter yet; retrying", task.channel, exc_info=True)
            self.submit(task, channel.policy.delay(max(task.attempts, 1)))
            return
        log.warning("%s: %s dead-lettered: %s", task.channel, task.event.request_id, error)
        self.report(Outcome(task.job, Kind.dead, task.channel, channel.kind, error))

    def close(self) -> None:
        """Stop scheduling; let deliveries already running finish; drop waiting retries."""
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify_all()
        for pool in self.pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        self._timer.join(timeout=5)
