"""Where an agent's coroutine runs: the worker's shared event loop, or this thread's own.

A worker process installs its one shared loop (`run_coroutines_with`), so the jobs of all its
slots advance their runs on it; `broker.testing` and in-process test workers keep a loop per
thread, as `Agent.run_sync` does, so cached clients keep their loop. A forked child (an RQ work
horse) never reuses, nor lets the collector close, a loop its parent made. Blocking calls from
an agent's coroutine go to a thread (`off_loop`), or to the loop's own asyncio client
(`loop_client`): never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import warnings
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

import anyio.to_thread
from redis import Redis

from broker.redis.async_client import AsyncRedis, async_client

_T = TypeVar("_T")

_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
"""Every loop `event_loop` made, in any thread of this process."""
_LOOP_CLIENTS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[Redis, AsyncRedis]
] = weakref.WeakKeyDictionary()
"""Per loop, the asyncio client made for each sync client (`loop_client`)."""
_INHERITED_LOOPS: list[asyncio.AbstractEventLoop] = []
"""In a forked child, the loops the parent had made: held so the child never collects them."""


def _forget_parent_loop() -> None:
    """In a forked child (an RQ work horse), never reuse the parent's loop: its selector and
    self-pipe are shared with the parent.

    Nor let any loop the parent made be garbage-collected here: closing one (as a collected
    loop does) unregisters its self-pipe from the epoll instance the child shares with the
    parent, and that loop would no longer wake for `call_soon_threadsafe` (a tool's worker
    thread reporting back), so the parent's next agent run on it would hang. The loops of the
    parent's other threads count too: those threads don't exist here, and what held their
    loops (a thread-local) may be gone.
    """
    with contextlib.suppress(Exception):
        _INHERITED_LOOPS.extend(_LOOPS)
    with contextlib.suppress(Exception):
        asyncio.set_event_loop(None)


os.register_at_fork(after_in_child=_forget_parent_loop)


def event_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, as `Agent.run_sync` uses it, so cached clients keep their loop."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:
            loop = None
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    _LOOPS.add(loop)
    return loop


class CoroutineRunner(Protocol):
    """Runs an agent's coroutine to its end from a job's thread and returns its result (or raises)."""

    def __call__(self, coro: Coroutine[Any, Any, _T], /) -> _T: ...


_coroutine_runner: CoroutineRunner | None = None


def run_coroutines_with(runner: CoroutineRunner | None) -> None:
    """Make `runner` run every agent coroutine of this process (None: this thread's own loop).

    The worker process installs its shared event loop here, so that the jobs of all its slots
    advance their runs on one loop; `broker.testing` and in-process test workers keep a loop
    per thread.
    """
    global _coroutine_runner
    _coroutine_runner = runner


def run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    if _coroutine_runner is not None:
        return _coroutine_runner(coro)
    return event_loop().run_until_complete(coro)


async def off_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """A blocking call (sync Redis) from the agent's coroutine, in a thread: never on the loop."""
    return await anyio.to_thread.run_sync(fn, *args)


def loop_client(sync: Redis) -> AsyncRedis:
    """The running loop's asyncio client on the Redis `sync` talks to (made on first use, with
    the patient client's timeouts and retries, `broker.redis.connection`, as the worker's sync
    client has: a run's step rides out a Redis restart). A redis.asyncio client is bound to the
    loop it first runs on, so each loop (the worker's shared one, a test's per thread) keeps its
    own, for as long as it lives."""
    loop = asyncio.get_running_loop()
    clients = _LOOP_CLIENTS.get(loop)
    if clients is None:
        clients = _LOOP_CLIENTS[loop] = weakref.WeakKeyDictionary()
    client = clients.get(sync)
    if client is None:
        client = clients[sync] = async_client(None, sync, patient=True)
    return client
