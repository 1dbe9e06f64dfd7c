"""The roles `up` runs as child processes, and how they stop: together, within one deadline.

Each role is a process of its own in its own process group (as in production, just on one
machine), restarted by `up` if it dies; Ctrl-C stops them all at once, so no RQ work-horse is
left behind and the fleet takes as long to stop as its slowest role, not their sum.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from approval_broker.exit_with_up import WATCH_ENV

STOP_S = 10.0
"""How long the roles get to finish what is in flight after Ctrl-C or SIGTERM, together."""

MAX_DEFAULT_WORKERS = 4
"""`up`'s default agent worker processes: one per core, at most this many (a laptop's fleet)."""


def default_workers() -> int:
    """One agent worker process per core, at most MAX_DEFAULT_WORKERS: a worker's runs share one
    event loop, so one process uses one core at most, and the agent loop is most of a cycle's
    CPU (docs: benchmarks). `up --workers N` overrides it."""
    if hasattr(os, "sched_getaffinity"):  # the cores this process may run on (Linux)
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def roles(workers: int) -> tuple[tuple[str, ...], ...]:
    """The role processes `up` runs: the API, `workers` agent workers, a notifier, a sweeper."""
    return (("api",), *(("worker",) for _ in range(workers)), ("notifier",), ("sweeper",))


@dataclass
class Child:
    """One role process, restarted if it dies while the fleet is up."""

    args: tuple[str, ...]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = field(default=0.0)

    @property
    def name(self) -> str:
        return self.args[0]

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "approval_broker", *self.args],
            env={**self.env, WATCH_ENV: "1"},
            stdin=subprocess.PIPE,  # closes when up exits, however: the role then stops itself
            start_new_session=True,  # its own process group: we stop it and its forks together
        )
        self.started_at = time.monotonic()

    def terminate(self) -> None:
        """Ask the role to stop (SIGTERM to its group): it finishes what is in flight."""
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)

    def finish(self, deadline: float) -> bool:
        """Wait until `deadline` (monotonic) for the role to exit, then kill what is left of its
        group; False if the role itself had to be killed."""
        if self.process is None:
            return True
        stopped = True
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stopped = False
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        _signal_group(self.process.pid, signal.SIGKILL)  # anything its forks left behind
        return stopped

    def stop(self, timeout: float = STOP_S) -> None:
        self.terminate()
        self.finish(time.monotonic() + timeout)


def stop_all(children: list[Child], timeout: float = STOP_S) -> list[str]:
    """Stop every role at once (each finishes its work in flight, in parallel with the others)
    within one `timeout`; the names of the roles that had to be killed.

    One after the other, a fleet's stops added up: the agent workers wait up to a slot's idle
    poll (2 s) each, so Ctrl-C took 6-8 s with two workers; together it takes the slowest one.
    """
    for child in children:
        child.terminate()
    deadline = time.monotonic() + timeout
    return [child.name for child in children if not child.finish(deadline)]


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
