"""Deliveries run on their channel's event loop, for a sender that delivers there.

A webhook's POST runs on an event loop (channels.webhook.http). With a delivery thread per
attempt, each one crossed threads twice: handed to the loop, then its answer handed back to the
waiting thread, whose wake-up was a fifth of a busy notifier's GIL time (py-spy, `--gil`). A
sender whose `event_loop()` names a loop has its attempts run there as tasks instead: the
dispatcher's states, parking and results are the same (`Dispatcher.start`, `finish`,
`settle`), at most `concurrency` attempts per channel run at once (the pool's thread count),
and what may call Redis after a failed attempt (a retry's parked record, a dead letter) runs in
the loop's executor, never on the loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from channels.retry import pause_delay
from channels.sender import Sender
from notifiers.tasks import Task
from notifiers.traced import delivery_span

if TYPE_CHECKING:
    from notifiers.dispatch import Dispatcher

CLOSE_S = 5.0
"""How long `close` lets attempts in flight finish."""


class LoopDeliveries:
    """Runs a dispatcher's tasks for channels that deliver on an event loop."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._limits: dict[str, asyncio.Semaphore] = {}  # made and used on each channel's loop
        self._running: dict[asyncio.AbstractEventLoop, set[asyncio.Task[None]]] = {}
        self._closed = False

    def submit(self, task: Task, channel: Sender, loop: asyncio.AbstractEventLoop) -> None:
        """Run one attempt of `task` on `loop` (from any thread; never waits)."""
        loop.call_soon_threadsafe(self._start, task, channel, loop)

    def _start(self, task: Task, channel: Sender, loop: asyncio.AbstractEventLoop) -> None:
        running = self._running.setdefault(loop, set())
        attempt = loop.create_task(self._run(task, channel))
        running.add(attempt)
        attempt.add_done_callback(running.discard)

    async def _run(self, task: Task, channel: Sender) -> None:
        dispatcher = self.dispatcher
        try:
            async with self._limit(task.channel, channel.concurrency):
                if not self._closed and dispatcher.start(task):
                    await self._attempt(task, channel)
        finally:
            dispatcher.ran(task)

    def _limit(self, name: str, concurrency: int) -> asyncio.Semaphore:
        limit = self._limits.get(name)
        if limit is None:
            limit = self._limits[name] = asyncio.Semaphore(max(1, concurrency))
        return limit

    async def _attempt(self, task: Task, channel: Sender) -> None:
        dispatcher = self.dispatcher
        wait = channel.not_before - time.monotonic()
        if wait > 0:  # the far end asked for a pause: not an attempt
            await asyncio.to_thread(dispatcher.later, task, pause_delay(wait))
            return
        try:
            with delivery_span(task, channel.kind):
                note = await channel.adeliver(task)
        except Exception as exc:  # noqa: BLE001 - every failure is settled, off the loop
            await asyncio.to_thread(dispatcher.settle, task, channel, exc)
        else:
            dispatcher.finish(task, channel, note)

    def close(self) -> None:
        """Let the attempts in flight finish (up to CLOSE_S); queued ones are dropped (they
        stay pending in the group, or parked)."""
        self._closed = True
        for loop, running in list(self._running.items()):
            if loop.is_closed():
                continue
            try:
                asyncio.run_coroutine_threadsafe(_finish(running), loop).result(CLOSE_S + 1)
            except Exception:  # noqa: BLE001 - what is left stays pending or parked
                pass


async def _finish(running: set[asyncio.Task[None]]) -> None:
    """On the loop that runs them: wait for `running`'s attempts (its own copy of the set)."""
    if running:
        await asyncio.wait(list(running), timeout=CLOSE_S)
