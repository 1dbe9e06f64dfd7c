"""The worker process's one event loop, where the agent runs of all its slots advance together.

The loop runs on the process's main thread. A slot (a thread taking RQ jobs) hands its job's
agent coroutine to the loop with `SharedLoop.run` and waits for the result, so fifty runs that
wait on a model cost fifty coroutines, not fifty processes. Two guards keep one run from holding
the others:

* a deadline (`[workers] run_timeout_s`): a run that hangs is cancelled and fails with that
  cause, while the rest of the loop goes on;
* a watchdog thread that notices the loop blocked by synchronous code (an agent calling
  `time.sleep`, a CPU-bound step) for longer than `[workers] loop_block_s`: it signals the main
  thread, and the handler raises `LoopBlocked` inside the task that holds the loop, so that run
  fails with its cause and the others continue.

It never runs anything but agent coroutines: a run's steps go to the loop's own asyncio Redis
client (or a thread, `broker.runs.agent_runner_writes`), and everything else of a job stays on
its slot's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Coroutine
from types import FrameType
from typing import Any

from broker.runs.agent_runner import RunFailed

log = logging.getLogger("workers.shared_loop")

TICK_S = 0.1
"""How often the loop proves it is alive (the watchdog's clock)."""
WATCHDOG_SIGNAL = signal.SIGUSR2
CANCEL_GRACE_S = 5.0
"""How long a timed-out run gets to unwind after its cancellation, before its slot moves on."""


class LoopBlocked(RunFailed):
    """Raised inside the task that kept the shared loop busy past `loop_block_s`."""


class SharedLoop:
    """Runs agent coroutines from slot threads on one loop (which must run on the main thread)."""

    def __init__(self, *, run_timeout_s: float, loop_block_s: float) -> None:
        self.run_timeout_s = run_timeout_s
        self.loop_block_s = loop_block_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._last_tick = time.monotonic()
        self._last_signal = 0.0
        self._main_ident = threading.main_thread().ident
        self._main_task: asyncio.Task[Any] | None = None
        self._stop = threading.Event()

    # ---- on the loop's thread ----------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start serving on `loop` (the running loop of the main thread)."""
        self.loop = loop
        self._main_task = asyncio.current_task(loop)
        self._tick()
        signal.signal(WATCHDOG_SIGNAL, self._on_watchdog_signal)
        threading.Thread(target=self._watch, name="loop-watchdog", daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    def _tick(self) -> None:
        self._last_tick = time.monotonic()
        if self.loop is not None and not self._stop.is_set():
            self.loop.call_later(TICK_S, self._tick)

    def _blocked_for(self) -> float:
        return time.monotonic() - self._last_tick

    def _on_watchdog_signal(self, signum: int, frame: FrameType | None) -> None:
        """Runs on the main thread, inside whatever holds the loop right now."""
        blocked = self._blocked_for()
        if blocked < self.loop_block_s:
            return  # the loop moved on before the signal landed
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return
        if task is None or task is self._main_task:
            log.warning("the event loop is blocked (%.1f s) outside any agent run", blocked)
            return
        raise LoopBlocked(
            f"the agent blocked the worker's event loop for {blocked:.1f} s with synchronous "
            f"code (more than [workers] loop_block_s = {self.loop_block_s:g}); use async calls "
            "or run blocking work in a thread. The run was stopped"
        )

    # ---- the watchdog's thread ---------------------------------------------------------------

    def _watch(self) -> None:
        interval = min(1.0, self.loop_block_s / 4)
        while not self._stop.wait(interval):
            blocked = self._blocked_for()
            now = time.monotonic()
            if blocked >= self.loop_block_s and now - self._last_signal >= self.loop_block_s:
                self._last_signal = now
                if self._main_ident is not None:
                    with contextlib.suppress(ProcessLookupError, OSError):
                        signal.pthread_kill(self._main_ident, WATCHDOG_SIGNAL)

    # ---- on a slot's thread ------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the shared loop and wait for it (`broker.runs.agent_loop.run_coroutines_with`)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            coro.close()
            raise RunFailed("the worker's event loop is not running")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        deadline = time.monotonic() + self.run_timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                done, _ = concurrent.futures.wait([future], timeout=min(left, 1.0))
                if done:
                    return future.result()
        finally:
            if not future.done():  # timed out, or the slot was interrupted (RQ's job timeout)
                future.cancel()
        concurrent.futures.wait([future], timeout=CANCEL_GRACE_S)
        raise RunFailed(
            f"the agent ran longer than [workers] run_timeout_s = {self.run_timeout_s:g} s in "
            "one round and was cancelled; the worker's other runs went on"
        )
