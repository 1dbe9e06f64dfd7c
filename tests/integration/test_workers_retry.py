"""Retries never run a tool twice, and a job that dies never leaves its run `running`.

The scripted agents record every tool execution in Redis, so each test counts what really
happened. Retries are made due at once (as RQ's scheduler does after the back-off).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from rq.job import Job

from broker.domain.models import Decision, RunStatus
from broker.facade import Broker
from broker.runs import agent_jobs as jobs
from broker.runs.agent_runner import AgentRunner
from broker.runs.agents import register_agent
from broker.runs.starting import resume_job_id, run_job_id, run_queue, start_run
from tests.support.agents import FAIL_AFTER, MAY_DIE, Recorder, recorder_for
from tests.support.inprocess_fleet import Fleet
from workers.slots import HEARTBEAT_TTL_S

SUPPORT = "tests.support.agents"


@pytest.fixture
def fleet(bound: Broker) -> Fleet:
    return Fleet(bound)


@pytest.fixture
def tools(broker: Broker) -> Recorder:
    for name in ("effects", "drop", "dying_tool", "killed"):
        register_agent(broker, name, f"{SUPPORT}:{name}_agent", deps=f"{SUPPORT}:make_recorder")
    return recorder_for(broker.redis, broker.keys.prefix)


def ran(recorder: Recorder) -> list[str]:
    return [c["tool"] for c in recorder.all()]


def retry_now(broker: Broker, job_id: str) -> None:
    """Move a job waiting out its retry back-off onto the queue, as the scheduler will."""
    queue = run_queue(broker)
    scheduled = queue.scheduled_job_registry
    assert job_id in scheduled.get_job_ids(), "the job is not waiting for a retry"
    job = queue.fetch_job(job_id)
    assert job is not None
    scheduled.remove(job)
    queue.enqueue_job(job)


def work_in_a_worker_process(broker: Broker, redis_url: str, tmp_path: Path) -> None:
    """`approval-broker worker --burst` in a process of its own, which the agents may SIGKILL;
    then RQ's maintenance pass, as a live worker runs it once the dead one's heartbeat is over."""
    env = {
        **os.environ,
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_KEY_PREFIX": broker.keys.prefix,
        MAY_DIE: "1",
    }
    env.pop("APPROVAL_BROKER_CONFIG", None)
    cli = Path(sys.executable).parent / "approval-broker"
    with (tmp_path / "worker.log").open("a") as log:
        subprocess.run(
            [str(cli), "worker", "--burst", "--no-resumer"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=False,
        )
    started = run_queue(broker).started_job_registry
    started.cleanup(timestamp=time.time() + HEARTBEAT_TTL_S + 1)


def last_attempt(broker: Broker, job_id: str) -> None:
    job = run_queue(broker).fetch_job(job_id)
    assert job is not None
    job.retries_left = 0
    job.save()


# ---- issue 1: checkpoints ----------------------------------------------------------------------


def test_a_retry_after_a_round_zero_tool_ran_continues_without_running_it_again(
    broker: Broker, fleet: Fleet, tools: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(FAIL_AFTER, "note", 1)  # the model's next call after `note` gets a 503
    run = start_run(broker, "effects", "Take a note, then pay.")
    fleet.work()
    assert broker.get_run(run.id).status is RunStatus.running  # waiting for its retry
    assert ran(tools) == ["note"]

    retry_now(broker, run_job_id(run.id))
    run = fleet.run(run.id)
    assert run.status is RunStatus.waiting, run.error  # `pay` waits for a person
    assert ran(tools) == ["note"]  # not run again by the retry


def test_a_retry_after_an_approved_tool_ran_does_not_apply_the_decisions_again(
    broker: Broker, fleet: Fleet, tools: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = fleet.run(start_run(broker, "effects", "Take a note, then pay.").id)
    [request] = broker.get_requests(run.pending)
    assert request.tool_name == "pay"
    monkeypatch.setitem(FAIL_AFTER, "pay", 1)  # the model's next call after `pay` gets a 503
    broker.decide(request.id, Decision(outcome="approved"), decided_by="alice")
    fleet.settle()
    assert ran(tools) == ["note", "pay"]
    assert broker.get_run(run.id).status is RunStatus.running  # waiting for its retry

    retry_now(broker, resume_job_id(run.id, 1))
    run = fleet.run(run.id)
    assert run.status is RunStatus.finished, run.error
    assert run.output == "note=noted; pay=success:paid 5"
    assert ran(tools) == ["note", "pay"]  # each exactly once


def test_a_tool_that_fails_after_its_effect_is_not_retried(
    broker: Broker, fleet: Fleet, tools: Recorder
) -> None:
    run = fleet.run(start_run(broker, "drop", "Send it to Ann.").id)
    assert run.status is RunStatus.failed
    assert run.error is not None and run.error.startswith(
        "ConnectError: connection reset while reading the reply (raised while the tools of "
        "round 0 ran; they are not run a second time"
    )
    assert run_queue(broker).scheduled_job_registry.count == 0
    assert ran(tools) == ["send"]


def test_a_worker_killed_while_a_tool_ran_fails_the_run_on_retry_instead_of_rerunning(
    broker: Broker, fleet: Fleet, tools: Recorder, redis_url: str, tmp_path: Path
) -> None:
    run = start_run(broker, "dying_tool", "Ship order A1.")
    work_in_a_worker_process(broker, redis_url, tmp_path)  # dies right after `ship`'s effect
    assert ran(tools) == ["ship"]
    assert broker.get_run(run.id).status is RunStatus.running  # retries are left: not failed yet

    retry_now(broker, run_job_id(run.id))
    fleet.work()
    run = broker.get_run(run.id)
    assert run.status is RunStatus.failed
    assert "interrupted in round 0 while its tools were running" in (run.error or "")
    assert ran(tools) == ["ship"]


# ---- issue 2: jobs that end without the runner ---------------------------------------------------


def test_a_worker_killed_on_its_last_attempt_fails_the_run(
    broker: Broker, fleet: Fleet, tools: Recorder, redis_url: str, tmp_path: Path
) -> None:
    run = start_run(broker, "killed", "anything")
    last_attempt(broker, run_job_id(run.id))
    work_in_a_worker_process(broker, redis_url, tmp_path)  # the agent SIGKILLs its worker
    run = broker.get_run(run.id)
    assert run.status is RunStatus.failed
    assert run.error is not None and "its worker stopped reporting" in run.error
    assert run_queue(broker).failed_job_registry.get_job_ids() == [run_job_id(run.id)]


def _abandon(broker: Broker, job_id: str) -> None:
    """Leave the job in the started registry with a heartbeat long gone, then let RQ clean up."""
    registry = run_queue(broker).started_job_registry
    broker.redis.zadd(registry.key, {f"{job_id}:lost-execution": 1})
    registry.cleanup()


def test_an_abandoned_job_on_its_last_attempt_fails_the_run(
    broker: Broker, fleet: Fleet, tools: Recorder
) -> None:
    run = start_run(broker, "effects", "Take a note, then pay.")
    broker.update_run(run.id, status=RunStatus.running)  # as if a worker had started it
    last_attempt(broker, run_job_id(run.id))
    _abandon(broker, run_job_id(run.id))
    run = broker.get_run(run.id)
    assert run.status is RunStatus.failed
    assert "abandoned" in (run.error or "")


def test_an_abandoned_job_with_retries_left_is_retried_and_the_run_kept(
    broker: Broker, fleet: Fleet, tools: Recorder
) -> None:
    run = start_run(broker, "effects", "Take a note, then pay.")
    _abandon(broker, run_job_id(run.id))
    assert broker.get_run(run.id).status is RunStatus.queued
    assert run_job_id(run.id) in run_queue(broker).scheduled_job_registry.get_job_ids()


def test_the_failure_callback_leaves_a_run_that_moved_on_alone(
    broker: Broker, fleet: Fleet, tools: Recorder
) -> None:
    run = fleet.run(start_run(broker, "effects", "Take a note, then pay.").id)
    assert run.status is RunStatus.waiting  # round 1 waits: the round-0 job is history
    job = Job.fetch(run_job_id(run.id), connection=broker.redis, serializer=run_queue(broker).serializer)  # fmt: skip
    job.retries_left = 0
    jobs.mark_failed(job, broker.redis, RuntimeError, RuntimeError("late"), None)
    assert broker.get_run(run.id).status is RunStatus.waiting


def test_recording_a_failure_rides_out_a_short_redis_outage(
    broker: Broker, tools: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = start_run(broker, "drop", "Send it to Ann.")
    real_update = broker.update_run
    outage = {"left": 2}

    def flaky_update(run_id: str, **fields: Any) -> None:
        if fields.get("status") is RunStatus.failed and outage["left"]:
            outage["left"] -= 1
            raise RedisConnectionError("connection reset")
        real_update(run_id, **fields)

    monkeypatch.setattr(broker, "update_run", flaky_update)
    assert AgentRunner(broker).advance(run.id, 0) == "failed"
    assert outage["left"] == 0
    assert broker.get_run(run.id).status is RunStatus.failed
