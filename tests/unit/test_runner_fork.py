"""A forked child (an RQ work horse, a test's crashing resumer) must not break the parent's loop.

The parent's event loop and the child share one epoll instance after a fork. If the child's
garbage collector closes the loop it inherited, closing unregisters the loop's self-pipe from
that shared epoll, and the parent's loop no longer wakes for `call_soon_threadsafe`: a tool
run in a worker thread then never reports back, and the agent run hangs.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections.abc import Callable
from typing import Any

from broker.runs.agent_loop import event_loop as _event_loop
from broker.runs.agent_loop import run_sync as _run_sync

WAKE_TIMEOUT_S = 10.0


def _in_a_thread_of_its_own(fn: Callable[[], Any]) -> Any:
    """`fn` on a fresh thread: a loop of the runner's own, which no pytest plugin holds on to."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(WAKE_TIMEOUT_S + 10)
    assert out, "the thread did not finish"
    return out[0]


def _wakes(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the loop's epoll still reports its self-pipe, which `call_soon_threadsafe` writes."""
    selector, pipe = loop._selector, loop._ssock  # type: ignore[attr-defined]
    loop._write_to_self()  # type: ignore[attr-defined]
    ready = selector.select(WAKE_TIMEOUT_S)
    loop._read_from_self()  # type: ignore[attr-defined]
    return any(key.fd == pipe.fileno() for key, _ in ready)


def _fork_then_look() -> tuple[int, bool, bool]:
    assert _run_sync(asyncio.sleep(0, result=True))  # this thread's loop, made by the runner
    before = _wakes(_event_loop())
    pid = os.fork()  # the runner's fork hook runs in the child
    if pid == 0:  # the child's collector runs, as an RQ horse's would
        try:
            gc.collect()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), before, _wakes(_event_loop())


def test_a_forked_child_collecting_garbage_leaves_the_parents_loop_awake() -> None:
    exit_code, before, after = _in_a_thread_of_its_own(_fork_then_look)
    assert exit_code == 0
    assert before
    assert after, "the parent's loop no longer hears call_soon_threadsafe"


def test_a_forked_child_leaves_the_loops_of_the_parents_other_threads_awake() -> None:
    forked, exit_codes = threading.Event(), []

    def other_thread() -> tuple[bool, bool]:
        assert _run_sync(asyncio.sleep(0, result=True))  # its loop, held by a thread-local only
        before = _wakes(_event_loop())
        ready.set()
        forked.wait(WAKE_TIMEOUT_S)
        return before, _wakes(_event_loop())

    ready = threading.Event()
    out: list[tuple[bool, bool]] = []
    thread = threading.Thread(target=lambda: out.append(other_thread()))
    thread.start()
    assert ready.wait(WAKE_TIMEOUT_S)
    pid = os.fork()  # from this thread: the other one doesn't exist in the child
    if pid == 0:
        try:
            gc.collect()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    exit_codes.append(os.waitstatus_to_exitcode(status))
    forked.set()
    thread.join(WAKE_TIMEOUT_S + 10)
    assert exit_codes == [0]
    assert out == [(True, True)], "the other thread's loop no longer hears call_soon_threadsafe"


def test_the_child_gets_a_loop_of_its_own() -> None:
    parent = _event_loop()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, b"same" if _event_loop() is parent else b"own")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"own"
    os.close(read)
    os.close(write)
