"""Process-tree helpers for tests that start the fleet: who are a process's descendants, are they gone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[1]), rest[0]


def descendants(root: int) -> set[int]:
    """Every live process below `root` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _ppid_and_state(int(entry))
            if info:
                parents[int(entry)] = info[0]
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    info = _ppid_and_state(pid)
    return info is not None and info[1] != "Z"


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """SIGTERM, SIGKILL if it is still there after `grace_s`; then close the pipes the test
    opened to it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
