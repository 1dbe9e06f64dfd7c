"""Runs with answered rounds and the outbox entries that resume them."""

from __future__ import annotations

from rq.job import Job

from broker.domain.models import Decision
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import resume_job_id, start_run
from broker.store.keys import RESUMER_GROUP
from tests.support.backends import (  # noqa: F401 - redis, broker, api_broker on both backends
    on_backend,
    on_backend_api_broker,
    on_backend_broker,
    resume_once,
    settings_for,
)
from tests.support.jobs import work


def resumes_of(broker: Broker, run_id: str, round_no: int = 1) -> int:
    """How many resumes of a run's round are on their way: its entries in either outbox plus
    its resume job (an API on the judge's async face enqueues it itself and deletes the entry;
    any other decision leaves the entry to the resumers). Exactly once is 1."""
    keys = broker.keys.of_run(run_id)
    entries = sum(
        1
        for stream in (keys.resumes, keys.resumes_direct)
        for _, f in broker.redis.xrange(stream)
        if f[b"run_id"] == run_id.encode() and f[b"round"] == str(round_no).encode()
    )
    job = Job.exists(resume_job_id(run_id, round_no), connection=broker.store.rq_redis)
    return entries + int(job)


def pending_entries(broker: Broker, partition: int = 0) -> int:
    stream = broker.keys.part(partition).resumes
    return int(broker.redis.xpending(stream, RESUMER_GROUP)["pending"])


def answered_run(broker: Broker) -> str:
    """A demo run whose single approval is decided: its resume sits in the outbox."""
    register_agent(broker, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
    run = start_run(broker, "refunds", "Refund $120 on order A103 because the floor is torn.")
    work(broker)
    [request_id] = broker.get_run(run.id).pending
    broker.decide(request_id, Decision(outcome="approved"), decided_by="alice")
    assert broker.redis.xlen(broker.keys.of_run(run.id).resumes) == 1
    return run.id
