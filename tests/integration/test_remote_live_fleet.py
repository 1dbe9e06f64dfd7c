"""Live waits on the fleet: with `live_wait_s` the job that paused a run waits for the round's
outcomes and goes on in the same job; otherwise (or too late) it stops and resumes as before.
Exactly once holds: a round is claimed by the live job or by the resumer, never both."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis
from rq.job import Job

from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, RunStatus
from broker.facade import Broker
from broker.runs import agent_jobs as jobs
from broker.runs import live_wait
from broker.runs.live_wait import LIVE, RESUMER, LiveWaits, claimed_by, live_field
from broker.runs.outbox import Resumer
from broker.runs.starting import resume_job_id, run_queue, start_run
from tests.support.jobs import jobs_bound_to
from tests.support.round_claims import claim
from tests.support.waiting import wait_for

executed: list[str] = []
_lock = threading.Lock()


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(str(returns[0].content))])
    return ModelResponse(parts=[ToolCallPart("refund", {"amount": 120}, tool_call_id="c1")])


agent: Agent[None, Any] = Agent(FunctionModel(script), output_type=[str, DeferredToolRequests])


@agent.tool_plain(requires_approval=True)
def refund(amount: float) -> str:
    with _lock:
        executed.append(f"refund {amount}")
    return f"refunded {amount}"


@pytest.fixture
def config() -> Config:
    path = f"{__name__}:agent"  # this very module, so `executed` is the one the tool fills
    return parse_config(
        {
            "agents": {
                "live": {"path": path, "live_wait_s": 20},
                "short": {"path": path, "live_wait_s": 0.3},
                "plain": {"path": path},  # no live_wait_s: the worker process's default
                "never": {"path": path, "live_wait_s": 0},
            }
        }
    )


@pytest.fixture
def fleet(broker: Broker) -> Iterator[Broker]:
    executed.clear()
    with jobs_bound_to(broker):
        yield broker


def in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return thread, out


def approve_when_pending(broker: Broker, run_id: str) -> None:
    [rid] = wait_for(lambda: broker.get_run(run_id).pending)
    broker.decide(rid, Decision(outcome="approved"), decided_by="alice")


def resume_job_exists(redis: Redis, run_id: str) -> bool:
    return Job.exists(resume_job_id(run_id, 1), connection=redis)


def test_decided_within_live_wait_the_run_goes_on_in_the_same_job(fleet: Broker) -> None:
    run = start_run(fleet, "live", "Refund $120")
    job, out = in_thread(jobs.run_agent, run.id)  # the job RQ would run
    approve_when_pending(fleet, run.id)
    job.join(30)
    assert out == ["finished"]
    finished = fleet.get_run(run.id)
    assert finished.status is RunStatus.finished and finished.output == "refunded 120.0"
    assert executed == ["refund 120.0"]
    # the round's outbox entry is acknowledged without a resume job: the live job owns it
    assert [h.action for h in Resumer(fleet, min_idle_ms=0, block_ms=None).run_once()] == ["live"]
    assert not resume_job_exists(fleet.redis, run.id)
    assert run_queue(fleet).job_ids == [f"run-{run.id}-0"]  # only the first job was ever enqueued


def test_the_live_wait_is_on_the_run_before_its_round_can_be_decided(fleet: Broker) -> None:
    """The pause's write carries the live wait's deadline, before the step that registers the
    round: a decision that completes the round, however soon, finds the wait (decide.lua and
    the resumer's claim step leave the round to the live job). Redis's clock dates the round's
    requests; the deadline is the job's clock, on the same machine, plus the 20 s wait."""
    run = start_run(fleet, "live", "Refund $120")
    job, out = in_thread(jobs.run_agent, run.id)
    [rid] = wait_for(lambda: fleet.get_run(run.id).pending)
    deadline = live_until(fleet, run.id)
    created = fleet.get_request(rid).created_at.timestamp()
    fleet.decide(rid, Decision(outcome="approved"), decided_by="alice")
    job.join(30)
    assert out == ["finished"] and claimed_by(fleet, run.id, 1) == LIVE
    assert deadline is not None and float(deadline) - 20 <= created


@pytest.fixture
def served() -> Iterator[LiveWaits]:
    """A worker process's live waits: 20 s for agents without their own, one place to wait."""
    waits = LiveWaits(20, 1)
    live_wait.serve(waits)
    try:
        yield waits
    finally:
        live_wait.serve(None)


def live_until(broker: Broker, run_id: str) -> bytes | None:
    """The run's `live_until:1`: written when a job starts to wait live for round 1."""
    return broker.redis.hget(broker.keys.run(run_id), live_field(1))


def test_an_agent_without_its_own_live_wait_waits_as_the_worker_process_serves(
    fleet: Broker, served: LiveWaits
) -> None:
    run = start_run(fleet, "plain", "Refund $120")
    job, out = in_thread(jobs.run_agent, run.id)
    approve_when_pending(fleet, run.id)
    job.join(30)
    assert out == ["finished"]
    assert executed == ["refund 120.0"]
    assert claimed_by(fleet, run.id, 1) == LIVE
    assert not resume_job_exists(fleet.redis, run.id)


def test_an_agent_with_live_wait_zero_never_waits_live_whatever_the_worker_serves(
    fleet: Broker, served: LiveWaits
) -> None:
    run = start_run(fleet, "never", "Refund $120")
    assert jobs.run_agent(run.id) == "waiting"  # at once: a wait would last 20 s
    assert live_until(fleet, run.id) is None


def test_with_every_place_taken_a_job_ends_without_waiting_and_resumes_as_before(
    fleet: Broker, served: LiveWaits
) -> None:
    run = start_run(fleet, "plain", "Refund $120")
    with served.place() as mine:  # another slot waits live in the only place
        assert mine
        assert jobs.run_agent(run.id) == "waiting"
    assert live_until(fleet, run.id) is None
    approve_when_pending(fleet, run.id)
    assert [h.action for h in Resumer(fleet, min_idle_ms=0, block_ms=None).run_once()] == [
        "enqueued"
    ]
    assert jobs.resume_agent(run.id, 1) == "finished"
    assert executed == ["refund 120.0"]
    with served.place() as again:  # the place was given back
        assert again


def test_jobs_run_outside_a_worker_process_wait_only_as_their_agent_says(fleet: Broker) -> None:
    run = start_run(fleet, "plain", "Refund $120")
    assert jobs.run_agent(run.id) == "waiting"
    assert live_until(fleet, run.id) is None


def test_too_late_for_the_live_wait_it_stops_and_resumes_as_before(fleet: Broker) -> None:
    run = start_run(fleet, "short", "Refund $120")
    assert jobs.run_agent(run.id) == "waiting"  # nobody answered within 0.3 s
    approve_when_pending(fleet, run.id)
    assert [h.action for h in Resumer(fleet, min_idle_ms=0, block_ms=None).run_once()] == [
        "enqueued"
    ]
    assert resume_job_exists(fleet.redis, run.id)
    assert jobs.resume_agent(run.id, 1) == "finished"
    assert executed == ["refund 120.0"]


def test_live_job_and_resumer_race_and_each_round_goes_on_once(fleet: Broker) -> None:
    """The round completes while the live job waits and a resumer polls the outbox: whichever
    claims it goes on with it; the other backs off."""
    stop = threading.Event()
    resumer = Resumer(fleet, consumer="racer", min_idle_ms=0, block_ms=20)
    racer = threading.Thread(target=resumer.run_forever, args=(stop,), daemon=True)
    racer.start()
    outcomes = []
    try:
        for i in range(12):
            run = start_run(fleet, "live", f"Refund $120, #{i}")
            job, out = in_thread(jobs.run_agent, run.id)
            approve_when_pending(fleet, run.id)
            job.join(30)
            if out == ["waiting"]:  # the resumer won: its resume job goes on with the round
                wait_for(lambda run_id=run.id: resume_job_exists(fleet.redis, run_id))
                assert jobs.resume_agent(run.id, 1) == "finished"
                outcomes.append("resumer")
            else:
                assert out == ["finished"]
                outcomes.append("live")
            assert fleet.get_run(run.id).status is RunStatus.finished
            wait_for(lambda: fleet.redis.xlen(fleet.keys.resumes) == 0)  # entry handled
            # exactly one owner: a live round never got a resume job, and vice versa
            assert resume_job_exists(fleet.redis, run.id) == (outcomes[-1] == "resumer")
    finally:
        stop.set()
        racer.join(10)
    assert executed == ["refund 120.0"] * 12  # each approved refund ran once
    assert set(outcomes) <= {"live", "resumer"}


def test_a_live_job_interrupted_after_claiming_is_continued_by_its_retry(fleet: Broker) -> None:
    run = start_run(fleet, "short", "Refund $120")
    assert jobs.run_agent(run.id) == "waiting"
    approve_when_pending(fleet, run.id)
    assert claim(fleet, run.id, 1, LIVE)  # as the live job does, just before it died
    assert jobs.run_agent(run.id) == "finished"  # RQ's retry of that same job
    assert executed == ["refund 120.0"]
    assert [h.action for h in Resumer(fleet, min_idle_ms=0, block_ms=None).run_once()] == ["live"]
    assert not resume_job_exists(fleet.redis, run.id)


def test_twenty_claimants_one_owner(broker: Broker) -> None:
    broker.create_run("live", "p", run_id="run_c")
    barrier = threading.Barrier(20)
    won: list[str] = []

    def claimant(who: str) -> None:
        barrier.wait()
        if claim(broker, "run_c", 1, who):
            with _lock:
                won.append(who)

    threads = [
        threading.Thread(target=claimant, args=(LIVE if i % 2 else RESUMER,)) for i in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(set(won)) == 1 and len(won) == 10  # one side owns it; every claim of it says so


def test_a_decision_over_the_api_leaves_the_round_to_its_live_job(fleet: Broker) -> None:
    """The REST decide route completes the round: its step claims a round for the resume job it
    enqueues itself, unless a live job waits for it (`live_until:N`); here the live job does, so
    it claims the round and goes on: no resume job; the resumer acknowledges the entry."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from broker.domain.settings import Settings

    admin = "tok-admin-of-the-live-api-test-01"
    run = start_run(fleet, "live", "Refund $120")
    job, out = in_thread(jobs.run_agent, run.id)
    [rid] = wait_for(lambda: fleet.get_run(run.id).pending)
    with TestClient(create_app(Settings(admin_token=admin), fleet.config, fleet)) as api:
        resp = api.post(
            f"/v1/requests/{rid}/decision",
            json={"outcome": "approved"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert resp.status_code == 200, resp.text
        job.join(30)
    assert out == ["finished"]
    assert claimed_by(fleet, run.id, 1) == LIVE
    assert not resume_job_exists(fleet.redis, run.id)
    # the step left the round's entry in `resumes_direct` (the recovery path): the resumer
    # acknowledges it, the round being the live job's
    direct = Resumer(fleet, min_idle_ms=0, block_ms=None, direct=True, grace_s=0.0)
    assert [h.action for h in direct.run_once()] == ["live"]
    assert fleet.redis.xlen(fleet.keys.resumes_direct) == 0
    assert executed == ["refund 120.0"]
