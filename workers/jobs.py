"""The agent jobs under their old import path.

The jobs themselves (`run_agent`, `resume_agent`, the `mark_failed` callback) and `bind` live in
`broker.runs.agent_jobs`, next to the code that enqueues them; they are re-exported here so a job queued
under its old name (`workers.jobs.run_agent`, before an upgrade) still runs. A worker process
that dies with jobs in flight needs no handler of its own: RQ finds the jobs abandoned and
retries them, and `mark_failed` fails the run after the last attempt.
"""

from __future__ import annotations

from broker.runs.agent_jobs import (
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
    "broker_on",
    "current_broker",
    "fail_run_of",
    "mark_failed",
    "resume_agent",
    "run_agent",
]
