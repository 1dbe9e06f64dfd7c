"""The RQ jobs (enqueued by name with RQ's JSON serializer): start a run, resume a round.

A worker binds its broker (Redis, config, key prefix) with `bind`; a job run anywhere else
builds one from the APPROVAL_BROKER_* environment on the job's own connection.
"""

from __future__ import annotations

from rq import get_current_job

from broker.client import Broker
from broker.config import Settings, load_config
from broker.runner import AgentRunner

_bound: Broker | None = None


def bind(broker: Broker | None) -> None:
    """Make `broker` the one the jobs of this process (and its forked work horses) use."""
    global _bound
    _bound = broker


def current_broker() -> Broker:
    if _bound is not None:
        return _bound
    job = get_current_job()
    if job is None:
        return Broker.from_settings()
    settings = Settings()
    return Broker(job.connection, load_config(settings.config), prefix=settings.key_prefix)


def _final_attempt() -> bool:
    job = get_current_job()
    return job is None or not job.retries_left


def run_agent(run_id: str) -> str:
    """Run a started run's agent on its prompt, until it finishes or pauses (round 1)."""
    return AgentRunner(current_broker()).advance(run_id, 0, final_attempt=_final_attempt())


def resume_agent(run_id: str, round_no: int) -> str:
    """Resume a run whose round `round_no` has every outcome."""
    return AgentRunner(current_broker()).advance(
        run_id, int(round_no), final_attempt=_final_attempt()
    )
