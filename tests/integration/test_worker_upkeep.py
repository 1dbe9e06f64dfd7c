"""A worker process's upkeep thread recovers abandoned jobs off the main thread.

Its own pass fails or retries them with a death penalty that works in any thread; then RQ's
pass runs, whose started registry arms SIGALRM around a job's failure callback. A job whose
heartbeat runs out between the two passes reached RQ's with the SIGALRM penalty, which Python
refuses off the main thread: the pass raised, and at a worker's start that ended the process.
"""

from __future__ import annotations

import threading

from redis import Redis

from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import run_job_id, run_queue, start_run
from tests.support.inprocess_fleet import Fleet
from workers.slots import Slots


class HeartbeatRunsOutBetweenPasses(Slots):
    """Slots whose own first recovery pass finds nothing, as when a job's heartbeat runs out
    just after it: the job is left for RQ's pass."""

    def __init__(self, queue_name: str, connection: Redis) -> None:
        super().__init__(queue_name, connection, concurrency=1)
        self.passes = 0

    def _recover_abandoned(self) -> None:
        self.passes += 1
        if self.passes > 1:
            super()._recover_abandoned()


def test_a_job_abandoned_between_the_upkeep_passes_is_recovered_off_the_main_thread(
    bound: Broker,
) -> None:
    Fleet(bound)
    register_agent(
        bound,
        "effects",
        "tests.support.agents:effects_agent",
        deps="tests.support.agents:make_recorder",
    )
    run = start_run(bound, "effects", "Take a note, then pay.")
    bound.update_run(run.id, status=RunStatus.running)  # as if a worker had started it
    queue = run_queue(bound)
    job = queue.fetch_job(run_job_id(run.id))
    assert job is not None
    job.retries_left = 0  # its last attempt: the failure callback fails the run
    job.save()
    queue.remove(job.id)
    bound.store.rq_redis.zadd(queue.started_job_registry.key, {f"{job.id}:lost-execution": 1})

    slots = HeartbeatRunsOutBetweenPasses(queue.name, bound.store.rq_redis)
    raised: list[BaseException] = []

    def upkeep() -> None:
        try:
            slots._maintain()
        except BaseException as exc:  # noqa: BLE001 - the thread's failure is the assertion
            raised.append(exc)

    thread = threading.Thread(target=upkeep, name="slot-keeper")
    thread.start()
    thread.join(60)

    assert not thread.is_alive()
    assert raised == []
    assert slots.passes == 2
    failed = bound.get_run(run.id)
    assert failed.status is RunStatus.failed
    assert "abandoned" in (failed.error or "")
    assert queue.started_job_registry.get_job_ids() == []
    assert queue.acquire_maintenance_lock(), "RQ's maintenance lock was left held"
    queue.release_maintenance_lock()
