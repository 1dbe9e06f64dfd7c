"""The RQ jobs (enqueued by name with RQ's JSON serializer): start a run, resume a round.

A worker binds its broker (Redis, config, key prefix) with `bind`; a job run anywhere else
builds one from the APPROVAL_BROKER_* environment on the job's own connection.

A job that ends without the runner recording the outcome (its work horse was SIGKILLed or ran
out of memory, or RQ found it abandoned) would leave the run `running` for ever; `mark_failed`
(RQ's `on_failure` callback) and `horse_killed` (the worker's work-horse-killed handler) fail
the run then, once no attempt is left.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from redis import Redis
from rq import get_current_job
from rq.job import Job

from broker.client import Broker
from broker.config import Settings, load_config
from broker.live_wait import owned_round
from broker.models import RunStatus
from broker.runner import AgentRunner
from broker.runs import RESUME_JOB, RUN_JOB

log = logging.getLogger("workers.jobs")

_bound: Broker | None = None


def bind(broker: Broker | None) -> None:
    """Make `broker` the one the jobs of this process (and its forked work horses) use."""
    global _bound
    _bound = broker


def _broker_on(connection: Redis) -> Broker:
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
    return _broker_on(job.connection)


def _final_attempt() -> bool:
    job = get_current_job()
    return job is None or not job.retries_left


def run_agent(run_id: str) -> str:
    """Run a started run's agent on its prompt, until it finishes or pauses (round 1)."""
    runner = AgentRunner(current_broker(), live_waits=True)
    return runner.advance(run_id, 0, final_attempt=_final_attempt())


def resume_agent(run_id: str, round_no: int) -> str:
    """Resume a run whose round `round_no` has every outcome."""
    runner = AgentRunner(current_broker(), live_waits=True)
    return runner.advance(run_id, int(round_no), final_attempt=_final_attempt())


def _run_and_round(job: Job) -> tuple[str, int] | None:
    """The (run, round) an agent job works on, or None for any other job."""
    args = list(job.args or [])
    if job.func_name == RUN_JOB and len(args) == 1:
        return str(args[0]), 0
    if job.func_name == RESUME_JOB and len(args) == 2 and str(args[1]).isdigit():
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
        fields = {k.decode(): v.decode() for k, v in pipe.hgetall(key).items()}
        done = (
            bool(fields)
            and fields.get("status") in (RunStatus.queued.value, RunStatus.running.value)
            and int(fields.get("round") or 0) == owned_round(fields, round_no)
        )
        pipe.multi()
        if done:
            failed = {"status": RunStatus.failed.value, "error": reason[:2000]}
            pipe.hset(key, mapping={**failed, "updated_at": f"{time.time():.6f}"})
            broker.expire_run(pipe, run_id)

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
    fail_run_of(job, _broker_on(connection), f"the job running this round ended: {what}")


def horse_killed(job: Job, retpid: int, ret_val: int, rusage: Any) -> None:
    """Worker `work_horse_killed_handler`: the horse died (SIGKILL, out of memory, ...)."""
    if job.retries_left:
        return  # RQ retries it; the runner takes it from there
    how = f"signal {os.WTERMSIG(ret_val)}" if os.WIFSIGNALED(ret_val) else f"status {ret_val}"
    fail_run_of(
        job,
        _broker_on(job.connection),
        f"the worker process running this round died ({how}, e.g. killed or out of memory) "
        "on its last attempt",
    )
