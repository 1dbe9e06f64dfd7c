"""End to end on a real Redis with real RQ workers (SimpleWorker, in this process).

Each test starts a run through `broker.runs.starting.start_run`, lets RQ run the job, decides requests
through the broker (as the API would), lets the resumer move the round to RQ, and checks what
really happened: the demo ledger, the tools' own records, the run's status and output.
"""

from __future__ import annotations

import time

import pytest
from refunds_demo import Ledger

from broker.domain.models import Decision, Request, Run, RunStatus, Status
from broker.facade import Broker
from broker.runs import agent_jobs as jobs
from broker.runs.agents import register_agent
from broker.runs.starting import resume_job_id, run_queue, start_run
from tests.support.agents import FLAKY, SECRET, recorder_for
from tests.support.inprocess_fleet import Fleet  # noqa: F401

DEMO = "refunds_demo:agent"


@pytest.fixture
def fleet(bound: Broker) -> Fleet:
    return Fleet(bound)


@pytest.fixture
def refunds(broker: Broker) -> Ledger:
    register_agent(broker, "refunds", DEMO, deps="refunds_demo:make_deps", max_rounds=3)
    return Ledger(broker.redis, broker.keys.prefix)


def only_request(broker: Broker, run: Run) -> Request:
    assert run.status is RunStatus.waiting, (run.status, run.error)
    [request] = broker.get_requests(run.pending)
    return request


def test_approved_refund_runs_the_tool_and_finishes(
    broker: Broker, fleet: Fleet, refunds: Ledger
) -> None:
    run = start_run(broker, "refunds", "Refund $120 on order A103 because the floor is torn.")
    request = only_request(broker, fleet.run(run.id))
    assert (request.kind, request.tool_name, request.queue) == ("approval", "issue_refund", "default")  # fmt: skip
    assert request.args == {"order_id": "A103", "amount": 120.0, "reason": "the floor is torn"}
    assert request.prompt.startswith("Refund $120.00 on order A103 (Two-person tent")
    assert refunds.all() == []  # nothing happens before a person says yes

    broker.decide(request.id, Decision(outcome="approved"), decided_by="alice")
    run = fleet.run(run.id)

    assert run.status is RunStatus.finished, run.error
    assert run.output["refunded"] is True and run.output["amount"] == 120.0
    [refund] = refunds.all()
    assert (refund.order_id, refund.amount, refund.run_id) == ("A103", 120.0, run.id)
    assert fleet.resumed == ["enqueued"]


def test_rejected_refund_does_not_run_and_the_model_sees_the_reason(
    broker: Broker, fleet: Fleet, refunds: Ledger
) -> None:
    run = start_run(broker, "refunds", "Refund $75 on order A100 because the sole came off.")
    request = only_request(broker, fleet.run(run.id))
    reason = "Send us a photo of the sole first."
    broker.decide(request.id, Decision(outcome="rejected", reason=reason), decided_by="bob")

    run = fleet.run(run.id)
    assert run.status is RunStatus.finished, run.error
    assert run.output["refunded"] is False
    assert reason in run.output["message"]
    assert refunds.all() == []


def test_modified_refund_runs_with_the_new_args(
    broker: Broker, fleet: Fleet, refunds: Ledger
) -> None:
    # $140: above what the demo refunds alone, below its two-person limit (one approver)
    run = start_run(broker, "refunds", "Refund $140 on order A103 because it rained inside.")
    request = only_request(broker, fleet.run(run.id))
    new_args = {"order_id": "A103", "amount": 80.0, "reason": "partial refund: one pole bent"}
    broker.decide(request.id, Decision(outcome="modified", args=new_args), decided_by="carol")

    run = fleet.run(run.id)
    assert run.status is RunStatus.finished, run.error
    assert run.output == {
        "refunded": True,
        "order_id": "A103",
        "amount": 80.0,
        "message": "Refunded $80.00 on order A103.",
    }
    [refund] = refunds.all()
    assert (refund.amount, refund.reason) == (80.0, "partial refund: one pole bent")


def test_timed_out_approval_is_a_denial_with_the_sweepers_reason(
    broker: Broker, fleet: Fleet, refunds: Ledger
) -> None:
    run = start_run(broker, "refunds", "Refund $80 on order A100 because it is too small.")
    request = only_request(broker, fleet.run(run.id))
    later = time.time() + 10_000
    assert [r.action for r in broker.sweep(now=later)] == ["escalated"]  # default -> managers
    assert [r.action for r in broker.sweep(now=later + 10_000)] == ["timed_out"]
    assert broker.get_request(request.id).status is Status.timed_out

    run = fleet.run(run.id)
    assert run.status is RunStatus.finished, run.error
    assert run.output["refunded"] is False
    assert "No one answered within" in run.output["message"]
    assert refunds.all() == []


def test_answered_question_is_the_tools_result_and_metadata_stays_out(
    broker: Broker, fleet: Fleet
) -> None:
    register_agent(broker, "asker", "tests.support.agents:ask_agent")
    run = start_run(broker, "asker", "What colour does the customer want?")
    request = only_request(broker, fleet.run(run.id))
    assert (request.kind, request.prompt) == ("question", "Customer asks: Which colour?")
    assert request.metadata["secret"] == SECRET  # for the app and the inbox ...

    broker.decide(request.id, Decision(outcome="answered", answer="forest green"), decided_by="dan")
    run = fleet.run(run.id)
    assert run.status is RunStatus.finished, run.error
    assert run.output == "success: forest green (secret seen: False)"  # ... never for the model


def test_rejected_question_tells_the_model_why(broker: Broker, fleet: Fleet) -> None:
    register_agent(broker, "asker", "tests.support.agents:ask_agent")
    run = start_run(broker, "asker", "What colour does the customer want?")
    request = only_request(broker, fleet.run(run.id))
    broker.decide(request.id, Decision(outcome="rejected", reason="Not our business"), decided_by="e")  # fmt: skip

    run = fleet.run(run.id)
    assert run.output == "failed: Rejected: Not our business (secret seen: False)"


def test_two_pending_calls_resume_once_only_after_both_are_decided(
    broker: Broker, fleet: Fleet
) -> None:
    register_agent(
        broker,
        "pair",
        "tests.support.agents:pair_agent",
        deps="tests.support.agents:make_recorder",  # fmt: skip
    )
    run = fleet.run(start_run(broker, "pair", "Email Ann and charge her card.").id)
    assert run.status is RunStatus.waiting and run.round == 1
    email, charge = broker.get_requests(run.pending)
    assert (email.tool_name, email.queue) == ("send_email", "managers")  # from the call's metadata
    assert (charge.tool_name, charge.queue) == ("charge_card", "default")  # the agent's queue

    broker.decide(
        email.id, Decision(outcome="approved", metadata={"ticket": "T-7"}), decided_by="fay"
    )
    fleet.settle()
    assert broker.get_run(run.id).status is RunStatus.waiting  # one of two: no resume yet
    assert recorder_for(broker.redis, broker.keys.prefix).all() == []
    assert run_queue(broker).count == 0 and fleet.resumed == []

    broker.decide(charge.id, Decision(outcome="rejected", reason="Card expired"), decided_by="gus")
    run = fleet.run(run.id)
    assert run.status is RunStatus.finished, run.error
    assert fleet.resumed == ["enqueued"]
    assert run.output == "send_email=success:sent to ann@example.com; charge_card=denied:Card expired"  # fmt: skip
    assert recorder_for(broker.redis, broker.keys.prefix).all() == [
        {"tool": "send_email", "to": "ann@example.com", "by": {"ticket": "T-7"}}  # reply metadata
    ]


def test_run_asking_past_max_rounds_fails_clearly(broker: Broker, fleet: Fleet) -> None:
    register_agent(broker, "looper", "tests.support.agents:loop_agent", max_rounds=2)
    run = fleet.run(start_run(broker, "looper", "go").id)
    for expected_round in (1, 2):
        request = only_request(broker, run)
        assert run.round == expected_round
        broker.decide(request.id, Decision(outcome="approved"), decided_by="hal")
        run = fleet.run(run.id)

    assert run.status is RunStatus.failed
    assert run.error == (
        "agent 'looper' asked for decisions again after 2 rounds (max_rounds = 2); "
        "the run was stopped"
    )
    assert run.pending == []


def test_transient_model_error_is_retried_with_back_off(
    broker: Broker, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_agent(broker, "flaky", "tests.support.agents:flaky_agent")
    monkeypatch.setitem(FLAKY, "failures_left", 1)
    run = start_run(broker, "flaky", "hello")
    before = time.time()
    fleet.work()

    queue = run_queue(broker)
    scheduled = queue.scheduled_job_registry
    assert scheduled.get_job_ids() == [f"run-{run.id}-0"]  # not failed: waiting to retry
    # RQ keeps whole seconds: failed at t >= before, due at floor(t + 2) >= before + 1
    due = scheduled.get_scheduled_time(f"run-{run.id}-0").timestamp()
    assert due >= before + 1  # back-off, not an immediate retry
    assert broker.get_run(run.id).status is RunStatus.running

    job = queue.fetch_job(f"run-{run.id}-0")
    scheduled.remove(job)
    queue.enqueue_job(job)  # as the scheduler will once the back-off is over
    run = fleet.run(run.id)
    assert (run.status, run.output) == (RunStatus.finished, "made it")


def test_non_transient_error_fails_the_run_at_once(broker: Broker, fleet: Fleet) -> None:
    register_agent(broker, "broken", "tests.support.agents:broken_agent")
    run = fleet.run(start_run(broker, "broken", "hello").id)
    assert run.status is RunStatus.failed
    assert run.error == "ValueError: the model adapter is broken"
    assert run_queue(broker).scheduled_job_registry.count == 0


def test_duplicate_resume_job_does_not_run_the_round_twice(
    broker: Broker, fleet: Fleet, refunds: Ledger
) -> None:
    run = start_run(broker, "refunds", "Refund $120 on order A103 because the floor is torn.")
    request = only_request(broker, fleet.run(run.id))
    broker.decide(request.id, Decision(outcome="approved"), decided_by="alice")
    assert fleet.run(run.id).status is RunStatus.finished

    # the same round's job run again (e.g. its id expired and a stale entry was re-driven)
    assert jobs.resume_agent(run.id, 1) == "skipped"
    assert jobs.run_agent(run.id) == "skipped"
    assert len(refunds.all()) == 1
    assert run_queue(broker).fetch_job(resume_job_id(run.id, 1)) is not None


def test_agent_registered_in_another_process_as_an_object_fails_clearly(
    broker: Broker, fleet: Fleet
) -> None:
    from broker.runs.agents import IN_PROCESS, LocalAgents

    # registered elsewhere as an object: this process has only the spec from Redis
    register_agent(broker, "elsewhere", object(), local=LocalAgents())
    run = fleet.run(start_run(broker, "elsewhere", "hi").id)
    assert run.status is RunStatus.failed
    assert "registered as an object in another process" in (run.error or "")
    assert IN_PROCESS in broker.redis.get(broker.keys.agent("elsewhere")).decode()


def test_deps_factory_gets_the_run_and_its_data(broker: Broker, fleet: Fleet) -> None:
    register_agent(broker, "refunds", DEMO, deps="refunds_demo:make_deps")
    run = start_run(broker, "refunds", "Refund $70 on order A100 because scuffed.", deps={"limit": 100})  # fmt: skip
    run = fleet.run(run.id)  # under this run's own limit: no approval asked
    assert run.status is RunStatus.finished and run.output["refunded"] is True
