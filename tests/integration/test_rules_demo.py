"""The demo's policy rule: `up --demo` starts one more run whose refund the rule
`demo-routine-refunds` approves with no person, while the two other demo runs still wait."""

from __future__ import annotations

import refunds_demo as demo
from refunds_demo import Ledger

from approval_broker.up import banner
from broker.domain.models import RunStatus, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.testing import SyncWorker


def test_the_rule_demo_run_is_approved_by_the_rule_and_the_others_still_wait(
    broker: Broker,
) -> None:
    demo.register_demo(broker)
    demo.add_demo_rule(broker)
    demo.add_demo_rule(broker)  # a restart: the rule is found in place
    waiting = demo.start_demo_runs(broker)
    ruled = demo.start_rule_demo_run(broker)
    SyncWorker(broker).work()
    run = broker.get_run(ruled)
    assert run.status is RunStatus.finished, run.error
    assert run.output["refunded"] is True and run.output["amount"] == 60
    [request] = broker.round_requests(ruled, 1)
    assert request.status is Status.approved
    assert (
        request.decision is not None and request.decision.decided_by == "rule:demo-routine-refunds"
    )
    assert Ledger(broker.redis, broker.keys.prefix, demo.RULE_DEMO_CUSTOMER).get("A100") is not None
    assert [broker.get_run(r).status for r in waiting] == [RunStatus.waiting] * 2
    pending = broker.list_requests(status="pending")
    assert sorted(r.run_id for r in pending) == sorted(waiting)
    assert all(r.suggested_rules for r in pending)  # the inbox offers "Approve always…"
    rule = broker.requests.rules.get("demo-routine-refunds")
    assert rule.hits == 1 and rule.created_by == "demo"


def test_the_banner_names_the_rule_demo_run() -> None:
    text = banner(Settings(redis_url="redis://x"), "t", False, ["run_a"], "run_r")
    assert "run_r (its refund is approved by rule demo-routine-refunds)" in text
