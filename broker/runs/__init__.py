"""Agent runs on the fleet: starting them (`starting`), the RQ jobs, advancing one round
(`agent_runner`), live waits, the outbox and the resumer's step, the agent registry, and the
tool guard.

The package re-exports `starting`, whose names were this import path's
before the package existed (`from broker.runs import start_run`)."""

# compatibility import path: re-exports only
from broker.runs.starting import (  # noqa: F401
    FINAL,
    RESUME_JOB,
    RUN_JOB,
    RUN_QUEUE,
    enqueue_resume,
    known_agents,
    resume_job_id,
    run_job_id,
    run_queue,
    start_run,
    wait_run,
)

__all__ = [
    "FINAL",
    "RESUME_JOB",
    "RUN_JOB",
    "RUN_QUEUE",
    "enqueue_resume",
    "known_agents",
    "resume_job_id",
    "run_job_id",
    "run_queue",
    "start_run",
    "wait_run",
]
