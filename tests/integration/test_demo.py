"""The demo refunds agent on a real Redis, advanced in this process by the synchronous worker."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import refunds_demo as demo
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis
from refunds_demo import AlreadyRefunded, Ledger, Refund

from broker.domain.models import Decision, Run, RunStatus
from broker.facade import Broker
from broker.runs.agents import DepsContext, register_agent
from broker.testing import SyncWorker


@pytest.fixture
def worker(broker: Broker) -> SyncWorker:
    demo.register_demo(broker)
    return SyncWorker(broker)


@pytest.fixture
def ledger(broker: Broker) -> Ledger:
    return Ledger(broker.redis, broker.keys.prefix)


def run(broker: Broker, worker: SyncWorker, prompt: str, deps: object = None) -> Run:
    from broker.runs.starting import start_run

    started = start_run(broker, "refunds", prompt, deps=deps)
    worker.work()
    return broker.get_run(started.id)


@pytest.mark.parametrize(
    ("prompt", "why"),
    [
        ("Refund $10 on order Z999 because it never came.", "There is no order 'Z999'"),
        ("Refund $100 on order A102 because wrong size.", "A102 is shipped, not delivered"),
        ("Refund $60 on order A104 because I changed my mind.", "A104 is cancelled"),
        ("Refund $300 on order A103 because broken.", "more than the order total of $240.00"),
    ],
)
def test_impossible_refunds_are_refused_without_asking_anyone(
    broker: Broker, worker: SyncWorker, ledger: Ledger, prompt: str, why: str
) -> None:
    result = run(broker, worker, prompt)
    assert result.status is RunStatus.finished, result.error
    assert result.output["refunded"] is False
    assert why in result.output["message"]
    assert broker.list_requests() == []  # nobody was asked
    assert ledger.all() == []


def test_an_order_refunded_once_is_refused_the_second_time(
    broker: Broker, worker: SyncWorker, ledger: Ledger
) -> None:
    first = run(broker, worker, "Refund $30 on order A100 because a lace snapped.")
    second = run(broker, worker, "Refund $120 on order A100 because they hurt.")
    assert first.output["refunded"] is True
    assert second.output["refunded"] is False
    assert "already been refunded" in second.output["message"]
    assert broker.list_requests() == []
    assert [(r.order_id, r.amount) for r in ledger.all()] == [("A100", 30.0)]


def test_small_refund_happens_on_its_own_and_large_one_waits(
    broker: Broker, worker: SyncWorker, ledger: Ledger
) -> None:
    small = run(broker, worker, "Refund $50 on order A103 because a peg was missing.")
    assert small.output == {
        "refunded": True,
        "order_id": "A103",
        "amount": 50.0,
        "message": "Refunded $50.00 on order A103.",
    }
    large = run(broker, worker, "Refund $84.50 on order A100 because they don't fit.")
    assert large.status is RunStatus.waiting
    [request] = broker.get_requests(large.pending)
    assert request.queue == "default"
    assert request.prompt == (
        "Refund $84.50 on order A100 (Trail running shoes, total $84.50)? "
        "The customer says: they don't fit"
    )
    assert request.metadata["order"] == {"id": "A100", "item": "Trail running shoes", "total": 84.5}
    assert [r.order_id for r in ledger.all()] == ["A103"]


def test_no_amount_means_the_order_total(broker: Broker, worker: SyncWorker) -> None:
    result = run(broker, worker, "Please refund order A101 because the socks are itchy.")
    assert result.output["amount"] == 18.0 and result.output["refunded"] is True


def test_start_demo_leaves_two_runs_waiting_in_the_inbox(broker: Broker) -> None:
    run_ids = demo.start_demo(broker)
    SyncWorker(broker).work()
    runs = [broker.get_run(r) for r in run_ids]
    assert [r.status for r in runs] == [RunStatus.waiting, RunStatus.waiting]
    pending = broker.list_requests(status="pending", queue="default")
    assert sorted(r.run_id for r in pending) == sorted(run_ids)
    assert all(r.args["amount"] > demo.AUTO_REFUND_LIMIT for r in pending)


def test_the_question_demo_run_asks_card_or_store_credit_and_refunds_as_answered(
    broker: Broker, worker: SyncWorker
) -> None:
    run_id = demo.start_question_demo_run(broker)  # what `up --demo` starts for the form
    worker.work()
    waiting = broker.get_run(run_id)
    assert waiting.status is RunStatus.waiting, waiting.error
    [request] = broker.get_requests(waiting.pending)
    assert (request.kind, request.queue) == ("question", demo.QUEUE)
    [q] = request.metadata["questions"]
    assert q["question"] == "Refund order A105 to the card or as store credit?"
    assert [o["label"] for o in q["options"]] == ["Card", "Store credit"]
    answer = {"answers": [{"question": q["question"], "selected": ["Card"]}]}
    broker.decide(request.id, Decision(outcome="answered", answer=answer), decided_by="alice")
    worker.work()
    done = broker.get_run(run_id)
    assert done.status is RunStatus.finished and done.output["refunded"] is True, done.error
    [refund] = Ledger(broker.redis, broker.keys.prefix, demo.QUESTION_DEMO_CUSTOMER).all()
    assert (refund.order_id, refund.amount, refund.run_id) == ("A105", 45.0, run_id)
    assert refund.reason.endswith("; refund to: Card")
    assert Ledger(broker.redis, broker.keys.prefix).all() == []  # the shop's own A105 still open


def test_a_claim_that_does_not_match_the_ledger_is_sent_back(
    broker: Broker, ledger: Ledger
) -> None:
    seen_retry: list[str] = []

    def liar(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        retries = [
            p
            for m in messages
            for p in m.parts
            if isinstance(p, ToolReturnPart | RetryPromptPart)
            and getattr(p, "outcome", "retried") == "retried"
        ]
        if retries:
            seen_retry.append(str(retries[-1].content))
        claim = {"refunded": not retries, "message": "done" if not retries else "nothing happened"}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, claim)])

    deps = demo.make_deps(DepsContext(broker, "run_liar", "refunds"))
    with demo.agent.override(model=FunctionModel(liar)):
        result = demo.agent.run_sync("Refund $10 on A101", deps=deps)
    assert result.output.refunded is False
    assert "the ledger shows no refund" in seen_retry[0]
    assert ledger.all() == []


def test_the_ledger_pays_an_order_once_under_a_race(broker: Broker, ledger: Ledger) -> None:
    start = threading.Barrier(8)
    winners: list[str] = []

    def pay(i: int) -> None:
        start.wait()
        try:
            ledger.record(Refund("A103", 100.0, "race", f"run{i}", f"call{i}", 0.0))
            winners.append(f"call{i}")
        except AlreadyRefunded:
            pass

    threads = [threading.Thread(target=pay, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(winners) == 1
    assert [r.tool_call_id for r in ledger.all()] == winners
    # the winning call retried (a retried job) gets its own refund back, not a second one
    again = ledger.record(Refund("A103", 100.0, "race", "x", winners[0], 1.0))
    assert again.tool_call_id == winners[0] and len(ledger.all()) == 1
    # ... but the second run of the refund step is counted
    assert ledger.attempts(winners[0]) == 2
    assert sum(ledger.attempts(f"call{i}") for i in range(8)) == 9


class SentTwice:
    """A Redis client whose every write reaches Redis twice: what a client's retry sends after
    Redis applied a write and died before answering it."""

    READS = ("hget", "hgetall", "hkeys")

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.redis, name)
        if name in self.READS:
            return method

        def twice(*args: Any, **kwargs: Any) -> Any:
            method(*args, **kwargs)
            return method(*args, **kwargs)

        return twice


def test_a_write_sent_again_after_redis_died_counts_one_run_of_the_step(broker: Broker) -> None:
    retried = Ledger(SentTwice(broker.redis), broker.keys.prefix, "c1")  # type: ignore[arg-type]
    retried.record(Refund("A103", 100.0, "retry", "run1", "call1", 0.0))
    ledger = Ledger(broker.redis, broker.keys.prefix, "c1")
    assert ledger.attempts("call1") == 1 and len(ledger.all()) == 1
    ledger.record(Refund("A103", 100.0, "retry", "run1", "call1", 1.0))  # the step ran again
    assert ledger.attempts("call1") == 2 and ledger.attempts("call2") == 0


def test_registered_without_its_deps_factory_fails_clearly(broker: Broker) -> None:
    register_agent(broker, "bare", "refunds_demo:agent")
    from broker.runs.starting import start_run

    started = start_run(broker, "bare", "Refund $10 on order A101 because.")
    SyncWorker(broker).work()
    failed = broker.get_run(started.id)
    assert failed.status is RunStatus.failed
    assert "needs its deps factory" in (failed.error or "")


def test_demo_model_is_a_real_model_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPROVAL_BROKER_DEMO_MODEL", "openai:gpt-4o-mini")
    assert demo.demo_model() == "openai:gpt-4o-mini"
    monkeypatch.delenv("APPROVAL_BROKER_DEMO_MODEL")
    assert isinstance(demo.demo_model(), FunctionModel)


def test_each_customer_has_their_own_orders_and_ledger(
    broker: Broker, worker: SyncWorker, ledger: Ledger
) -> None:
    ann = run(
        broker, worker, "Refund $30 on order A100 because a lace snapped.", {"customer": "ann"}
    )
    bob = run(
        broker, worker, "Refund $30 on order A100 because a lace snapped.", {"customer": "bob"}
    )
    again = run(broker, worker, "Refund $20 on order A100 because of the other lace.", {"customer": "ann"})  # fmt: skip
    assert [ann.output["refunded"], bob.output["refunded"]] == [True, True]
    assert again.output["refunded"] is False
    assert "already been refunded" in again.output["message"]
    for customer, run_id in (("ann", ann.id), ("bob", bob.id)):
        [refund] = Ledger(broker.redis, broker.keys.prefix, customer).all()
        assert (refund.order_id, refund.amount, refund.run_id) == ("A100", 30.0, run_id)
    assert ledger.all() == []  # the shop's own ledger is untouched


def test_a_customers_large_refund_names_them_and_is_paid_once_when_approved(
    broker: Broker, worker: SyncWorker
) -> None:
    waiting = run(broker, worker, "Refund $120 on order A103 because the floor is torn.", {"customer": "c-17"})  # fmt: skip
    [request] = broker.get_requests(waiting.pending)
    assert "on order A103 (Two-person tent, total $240.00) of customer c-17?" in request.prompt
    assert request.metadata["customer"] == "c-17"
    assert request.quorum == 1  # below the two-person limit
    broker.decide(request.id, Decision(outcome="approved"), decided_by="alice")
    worker.work()
    done = broker.get_run(waiting.id)
    assert done.status is RunStatus.finished and done.output["refunded"] is True
    ledger = Ledger(broker.redis, broker.keys.prefix, "c-17")
    assert [(r.order_id, r.tool_call_id) for r in ledger.all()] == [("A103", request.tool_call_id)]
    assert ledger.attempts(request.tool_call_id) == 1


@pytest.mark.parametrize(
    ("deps", "why"),
    [
        ({"customer": "no spaces please"}, "customer 'no spaces please' must be"),
        ({"customer": 17}, "deps.customer must be a string, not int"),
    ],
)
def test_a_bad_customer_fails_the_run_saying_why(
    broker: Broker, worker: SyncWorker, deps: dict[str, object], why: str
) -> None:
    failed = run(broker, worker, "Refund $10 on order A101 because.", deps)
    assert failed.status is RunStatus.failed
    assert why in (failed.error or "")
    assert broker.list_requests() == []


def test_a_refund_above_the_two_person_limit_needs_two_different_approvers(
    broker: Broker, worker: SyncWorker, ledger: Ledger
) -> None:
    """$200 asks for two approvers (the tool's metadata sets quorum 2); $75 for one."""
    large = run(broker, worker, "Refund $200 on order A103 because the floor is torn.")
    small = run(broker, worker, "Refund $75 on order A100 because the soles came off.")
    [two] = broker.get_requests(large.pending)
    [one] = broker.get_requests(small.pending)
    assert (two.quorum, one.quorum) == (2, 1)
    assert two.metadata["quorum"] == 2
    broker.decide(two.id, Decision(outcome="approved"), decided_by="alice")
    again = broker.decide(two.id, Decision(outcome="approved"), decided_by="alice")
    worker.work()
    assert again.is_pending and [v.by for v in again.approvals] == ["alice"]
    assert broker.get_run(large.id).status is RunStatus.waiting
    assert ledger.all() == []  # one person (twice) is not two
    broker.decide(two.id, Decision(outcome="approved"), decided_by="bob")
    broker.decide(one.id, Decision(outcome="approved"), decided_by="carol")
    worker.work()
    assert broker.get_run(large.id).output["refunded"] is True
    assert broker.get_run(small.id).output["refunded"] is True
    assert sorted(r.order_id for r in ledger.all()) == ["A100", "A103"]
    assert sorted(v.by for v in broker.get_request(two.id).approvals) == ["alice", "bob"]
