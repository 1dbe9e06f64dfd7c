"""A channel's delivery threads: a fixed set of threads taking calls from one queue.

ThreadPoolExecutor makes a Future (with its Condition and lock) per call and checks its thread
count on every submit; the dispatcher wants neither (it keeps its own task states), and that
hand-off was a quarter of a busy notifier's GIL time in a py-spy profile. Here a call is one
`SimpleQueue.put`. Like `shutdown(wait=True, cancel_futures=True)`, `shutdown` lets running
calls finish and drops queued ones.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("notifiers")

Call = tuple[Callable[..., Any], tuple[Any, ...]]


class DeliveryPool:
    """`workers` daemon threads started on first use; `submit` after `shutdown` raises."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self.name = name
        self._queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name}: the pool is shut down")
        if len(self._threads) < self.workers:
            self._start_threads()
        self._queue.put((fn, args))

    def _start_threads(self) -> None:
        with self._lock:
            while len(self._threads) < self.workers and not self._closed:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _work(self) -> None:
        while True:
            call = self._queue.get()
            if call is None or self._closed:
                return
            fn, args = call
            try:
                fn(*args)
            except Exception:  # the dispatcher catches its own; this is a bug
                log.exception("%s: a delivery call failed", self.name)

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop taking calls; running ones finish, queued ones are dropped."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join(timeout)
