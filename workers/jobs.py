"""The worker process's side of the agent jobs: what it does when a work horse dies.

The jobs themselves (`run_agent`, `resume_agent`, the `mark_failed` callback) and `bind` live in
`broker.jobs`, next to the code that enqueues them; they are re-exported here so a job queued
under its old name (`workers.jobs.run_agent`, before an upgrade) still runs.
"""

from __future__ import annotations

import os
from typing import Any

from rq.job import Job

from broker.jobs import (
    bind,
    broker_on,
    current_broker,
    fail_run_of,
    mark_failed,
    resume_agent,
    run_agent,
)

__all__ = [
    "bind",
    "current_broker",
    "fail_run_of",
    "horse_killed",
    "mark_failed",
    "resume_agent",
    "run_agent",
]


def horse_killed(job: Job, retpid: int, ret_val: int, rusage: Any) -> None:
    """Worker `work_horse_killed_handler`: the horse died (SIGKILL, out of memory, ...)."""
    if job.retries_left:
        return  # RQ retries it; the runner takes it from there
    how = f"signal {os.WTERMSIG(ret_val)}" if os.WIFSIGNALED(ret_val) else f"status {ret_val}"
    fail_run_of(
        job,
        broker_on(job.connection),
        f"the worker process running this round died ({how}, e.g. killed or out of memory) "
        "on its last attempt",
    )
