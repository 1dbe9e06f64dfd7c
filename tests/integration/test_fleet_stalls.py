"""The fleet test's stall naming (tests/support/fleet_stalls.py) names only bounded causes.

A run whose job waits where no recovery of the fleet will move it (queued and never taken, gone
from Redis, taken while no worker was SIGKILLed) must come back unnamed, so a liveness bug fails
the fleet test instead of being waited out.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rq import Queue
from rq.serializers import JSONSerializer

from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import run_queue, start_run
from tests.support.fleet_stalls import (
    IN_THE_OUTBOX,
    RETRY_BACK_OFF,
    TAKEN_NOT_STARTED,
    why_open,
    worker_pid,
)


def test_only_a_cause_the_fleet_recovers_from_names_a_stall(broker: Broker) -> None:
    register_agent(broker, "refunds", "refunds_demo:refunds_agent")
    queued, taken, retried = (
        start_run(broker, "refunds", f"Refund ${n} on A100") for n in (5, 6, 7)
    )
    queue = run_queue(broker)
    killed = {4242}

    cause, state = why_open(broker, queued.id, killed)
    assert cause is None and "queued" in state  # nobody took it: no recovery will

    while True:  # a worker takes jobs off the queue (into RQ's intermediate queue) and dies
        job, _ = Queue.dequeue_any([queue], None, connection=queue.connection, serializer=JSONSerializer)  # fmt: skip
        if job.id.endswith(f"{taken.id}-0"):
            break
    assert why_open(broker, taken.id, killed)[0] == TAKEN_NOT_STARTED
    assert why_open(broker, taken.id, set())[0] is None  # no worker was killed: a stuck job

    job = queue.fetch_job(f"run-{retried.id}-0")
    assert job is not None
    queue.scheduled_job_registry.schedule(job, datetime.now(UTC) + timedelta(seconds=60))
    assert why_open(broker, retried.id, killed)[0] == RETRY_BACK_OFF

    broker.redis.xadd(broker.keys.resumes, {"run_id": retried.id, "round": "1"})
    assert why_open(broker, retried.id, killed)[0] == IN_THE_OUTBOX  # a dead resumer's entry

    broker.redis.delete(broker.keys.run(retried.id))
    assert why_open(broker, retried.id, killed) == (None, "the run is gone")
    assert worker_pid("4242.1a2b3c4d.7") == 4242 and worker_pid(None) is None
