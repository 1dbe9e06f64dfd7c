"""A compatibility import path: the names of `broker.runs.agent_jobs`, kept by RQ: a job queued
before the upgrade names `broker.jobs.run_agent`.
"""

# compatibility import path: re-exports only
from broker.runs.agent_jobs import (  # noqa: F401
    RESUME_JOB,
    RUN_JOB,
    bind,
    broker_on,
    current_broker,
    fail_run_of,
    job_name,
    mark_failed,
    resume_agent,
    run_agent,
)

__all__ = [
    "RESUME_JOB",
    "RUN_JOB",
    "bind",
    "broker_on",
    "current_broker",
    "fail_run_of",
    "job_name",
    "mark_failed",
    "resume_agent",
    "run_agent",
]
