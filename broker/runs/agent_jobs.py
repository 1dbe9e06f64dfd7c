"""The RQ jobs of a run (start it, resume a round) and the callback that fails a dead one.

They live here, beside the code that enqueues them (`broker.runs.starting`), so the broker names its
jobs by the functions themselves and never by a string pointing into `workers`. The worker
process (workers/worker.py) binds its broker with `bind`; a job run anywhere else builds one
from the APPROVAL_BROKER_* environment on the job's own connection.

A job that ends without the runner recording the outcome (its worker process was SIGKILLed or
ran out of memory, so RQ found it abandoned) would leave the run `running` for ever;
`mark_failed` (RQ's `on_failure` callback, which RQ also runs for an abandoned job) fails the
run then, once no attempt is left.

The runner (and with it pydantic-ai, about 1.5 s of imports) is loaded by the job functions when
a worker first runs one, not by this module: the API and the CLI import it only to enqueue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from redis import Redis
from rq import get_current_job
from rq.job import Job

from broker.domain.config import load_config
from broker.domain.models import RunStatus
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.replies import as_str_dict
from broker.runs.live_wait import owned_round
from broker.tracing import spans as traced

if TYPE_CHECKING:
    from broker.runs.agent_runner import AgentRunner

log = logging.getLogger("broker.runs.agent_jobs")

_bound: Broker | None = None


def bind(broker: Broker | None) -> None:
    """Make `broker` the one the jobs of this process use."""
    global _bound
    _bound = broker


def broker_on(connection: Redis) -> Broker:
    """The bound broker, else one from the environment on `connection` (a job's own)."""
    if _bound is not None:
        return _bound
    settings = Settings()
    return Broker(connection, load_config(settings.config), prefix=settings.key_prefix)


def current_broker() -> Broker:
    if _bound is not None:
        return _bound
    job = get_current_job()
    if job is None:
        return Broker.from_settings()
    return broker_on(job.connection)


def _final_attempt() -> bool:
    job = get_current_job()
    return job is None or not job.retries_left


def _traced(run_id: str, round_no: int) -> AbstractContextManager[Any]:
    """The job's span, continuing the trace its enqueuer put in its meta (`broker.tracing.spans`)."""
    job = get_current_job()
    return traced.job(job.meta if job else None, job.id if job else None, run_id, round_no)


def _runner() -> AgentRunner:
    """The runner on this process's broker, imported here so that enqueueing never loads it."""
    from broker.runs.agent_runner import AgentRunner

    return AgentRunner(current_broker(), live_waits=True)


def run_agent(run_id: str) -> str:
    """Run a started run's agent on its prompt, until it finishes or pauses (round 1)."""
    runner = _runner()
    with _traced(run_id, 0):
        return runner.advance(run_id, 0, final_attempt=_final_attempt())


def resume_agent(run_id: str, round_no: int) -> str:
    """Resume a run whose round `round_no` has every outcome."""
    runner = _runner()
    with _traced(run_id, int(round_no)):
        return runner.advance(run_id, int(round_no), final_attempt=_final_attempt())


def job_name(func: Callable[..., Any]) -> str:
    """The import path RQ records for a job function (`Job.func_name`)."""
    return f"{func.__module__}.{func.__qualname__}"


RUN_JOB = job_name(run_agent)
RESUME_JOB = job_name(resume_agent)


def _run_and_round(job: Job) -> tuple[str, int] | None:
    """The (run, round) an agent job works on, or None for any other job.

    Judged by the function the job's name imports, so a job queued under an older name of the
    same function (`workers.jobs.run_agent`, before an upgrade) counts too.
    """
    try:
        func = job.func
    except (ImportError, AttributeError, ValueError):
        return None
    args = list(job.args or [])
    if func is run_agent and len(args) == 1:
        return str(args[0]), 0
    if func is resume_agent and len(args) == 2 and str(args[1]).isdigit():
        return str(args[0]), int(args[1])
    return None


def fail_run_of(job: Job, broker: Broker, reason: str) -> bool:
    """Fail the job's run if it is still queued or running in the job's round; True if it did.

    Checked and set in one WATCH/MULTI transaction, so a run that the job (or a later round)
    finished or paused meanwhile is left alone.
    """
    target = _run_and_round(job)
    if target is None:
        return False
    run_id, round_no = target
    key = broker.keys.run(run_id)
    done = False

    def fail_if_current(pipe: Any) -> None:
        nonlocal done
        fields = as_str_dict(pipe.hgetall(key))
        done = (
            bool(fields)
            and fields.get("status") in (RunStatus.queued.value, RunStatus.running.value)
            and int(fields.get("round") or 0) == owned_round(fields, round_no)
        )
        pipe.multi()
        if done:
            failed = {"status": RunStatus.failed.value, "error": reason[:2000]}
            pipe.hset(key, mapping={**failed, "updated_at": f"{time.time():.6f}"})
            broker.run_store.expire_run(pipe, run_id)
            broker.run_store.announce(pipe, run_id, failed["status"])

    broker.redis.transaction(fail_if_current, key)
    if done:
        log.warning("run %s failed in round %s: %s", run_id, round_no, reason)
    return done


def mark_failed(
    job: Job,
    connection: Redis,
    exc_type: type[BaseException] | None = None,
    exc_value: BaseException | None = None,
    tb: Any = None,
) -> None:
    """RQ `on_failure` callback: fail the run when this was the job's last attempt.

    RQ calls it for every failed attempt (and for a job it finds abandoned); while retries are
    left, the next attempt decides.
    """
    if job.retries_left:
        return
    what = f"{exc_type.__name__}: {exc_value}" if exc_type is not None else "it failed"
    if exc_type is not None and exc_type.__name__ == "AbandonedJobError":
        what = "its worker stopped reporting (the job was abandoned)"
    fail_run_of(job, broker_on(connection), f"the job running this round ended: {what}")
