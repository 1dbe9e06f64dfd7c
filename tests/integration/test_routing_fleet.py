"""Risk-tiered refunds with REAL agent runs on the fleet (RQ SimpleWorker and the resumer, in this
process) on a real Redis, the notifier fleet delivering to fake Slack, SMTP and a webhook
receiver, and the config's rules: a small refund is approved by an allow rule with nobody
asked; a big one is routed to `finance`, shows its risk on every card, and needs two different
people; a huge one is denied. Then the same figures in `/v1/stats`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, Outcome, RunStatus, Status
from broker.domain.principals import Principal
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.judge import Judge
from broker.runs.starting import run_queue, start_run
from broker.store.rule_sync import sync_at_start
from tests.support.agents import Recorder, recorder_for
from tests.support.auth import bearer
from tests.support.fakes.harness import running, webhook
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.smtp import SmtpSink
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.jobs import jobs_bound_to, work
from tests.support.notifier_setup import email_section, slack_section
from tests.support.waiting import wait_for
from workers.resumer import Resumer

ADMIN = "tok-admin-routing-fleet-0123456789"
RISK = "high: refund over 500"


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Refund the amount the prompt names, then say what the tool answered."""
    returns = [p for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return"]
    if returns:
        return ModelResponse(parts=[TextPart(f"refund: {returns[-1].content}")])
    prompt = next(p.content for m in messages for p in m.parts if p.part_kind == "user-prompt")
    amount = int(str(prompt).split()[-1])
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1", "amount": amount})])


refunder = Agent(
    FunctionModel(_script), deps_type=Recorder, output_type=[str, DeferredToolRequests]
)


@refunder.tool(requires_approval=True)
def refund(ctx: RunContext[Recorder], order: str, amount: int) -> str:
    ctx.deps.add({"order": order, "amount": amount})
    return f"refunded {amount}"


def config(slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver) -> Config:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox", "webhook:ops"]},
                "finance": {"channels": ["inbox", "slack:finance", "email:finance", "webhook:ops"]},
            },
            "webhooks": {"ops": webhook(receiver.url("/ops"))},
            "slack": slack_section(slack, channels=("finance",)),
            "email": email_section(smtp, lists={"finance": {"to": ["fin@example.com"]}}),
            "approvers": {"alice": {"roles": ["finance"]}, "bob": {"roles": ["finance"]}},
            "agents": {
                "refunder": {
                    "path": "tests.integration.test_routing_fleet:refunder",
                    "deps": "tests.support.agents:make_recorder",
                }
            },
            "rules": [
                {
                    "id": "small",
                    "effect": "allow",
                    "tool": "refund",
                    "args": {"amount": {"le": 100}},
                },
                {
                    "id": "big",
                    "effect": "route",
                    "tool": "refund",
                    "args": {"amount": {"gt": 500}},
                    "route": {"queue": "finance", "quorum": 2, "risk": RISK},
                },
                {
                    "id": "huge",
                    "effect": "deny",
                    "tool": "refund",
                    "args": {"amount": {"gt": 5000}},
                    "reason": "Refunds over 5,000 need the CFO.",
                },
            ],
        }  # fmt: skip
    )


class Fleet:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.resumer = Resumer(broker, consumer="test-resumer", block_ms=None)

    def settle(self) -> None:
        for _ in range(20):
            self.resumer.run_once()
            if run_queue(self.broker).count == 0:
                return
            work(self.broker)
        raise AssertionError("the fleet never settled")


@pytest.fixture
def fleet_broker(
    redis: Redis, slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver
) -> Iterator[Broker]:
    broker = Broker(redis, config(slack, smtp, receiver), prefix="t:")
    sync_at_start(broker.requests.rules)
    with jobs_bound_to(broker):
        yield broker


def test_small_auto_big_routed_to_two_people_in_finance_huge_denied(
    fleet_broker: Broker, slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver
) -> None:
    broker = fleet_broker
    fleet = Fleet(broker)
    judge = Judge(broker)
    alice = Principal("alice", frozenset({"finance"}))
    bob = Principal("bob", frozenset({"finance"}))
    with running(broker):
        small = start_run(broker, "refunder", "refund 80")
        big = start_run(broker, "refunder", "refund 800")
        huge = start_run(broker, "refunder", "refund 9000")
        fleet.settle()
        assert broker.get_run(small.id).status is RunStatus.finished
        assert broker.get_run(huge.id).status is RunStatus.finished
        [asked] = broker.round_requests(big.id, 1)
        assert (asked.queue, asked.quorum, asked.risk) == ("finance", 2, RISK)
        assert asked.status is Status.pending
        assert broker.get_run(big.id).status is RunStatus.waiting
        # every card shows the risk: Slack, the mail, the webhook body
        wait_for(lambda: slack.posts_for(asked.id) and smtp.to("fin@example.com"))
        [post] = slack.posts_for(asked.id)
        assert f":warning: *Risk:* {RISK}" in str(post["blocks"])
        [mail] = smtp.to("fin@example.com")
        assert f"Risk:           {RISK}" in mail.part("plain") and RISK in mail.part("html")
        assert f"[risk: {RISK}]" in mail.message["Subject"]
        wait_for(
            lambda: any(h.payload["data"]["id"] == asked.id for h in receiver.accepted("/ops"))
        )
        [hook] = [h for h in receiver.accepted("/ops") if h.payload["data"]["id"] == asked.id]
        assert hook.payload["type"] == "approval.requested" and hook.payload["data"]["risk"] == RISK
        # two different people: alice's approval is a vote, again is a repeat, bob's decides
        approve = Decision(outcome=Outcome.approved)
        first = judge.decide(asked.id, approve, alice, via=("inbox",))
        assert first.request.status is Status.pending and len(first.request.approvals) == 1
        again = judge.decide(asked.id, approve, alice, via=("inbox",))
        assert again.request.status is Status.pending and len(again.request.approvals) == 1
        fleet.settle()
        assert broker.get_run(big.id).status is RunStatus.waiting
        done = judge.decide(asked.id, approve, bob, via=("inbox",))
        assert done.request.status is Status.approved
        fleet.settle()
    assert broker.get_run(big.id).status is RunStatus.finished
    outputs = {run.id: str(broker.get_run(run.id).output) for run in (small, big, huge)}
    assert "refunded 80" in outputs[small.id] and "refunded 800" in outputs[big.id]
    assert "Refunds over 5,000 need the CFO." in outputs[huge.id]
    assert sorted(r["amount"] for r in recorder_for(broker.redis, "t:").all()) == [80, 800]
    [ruled] = broker.round_requests(small.id, 1)
    [denied] = broker.round_requests(huge.id, 1)
    assert ruled.decision.rule == "small" and denied.decision.rule == "huge"
    assert ruled.queue == denied.queue == "default" and ruled.risk is None
    assert slack.posts_for(ruled.id) == [] and slack.posts_for(denied.id) == []
    history = [h.event for h in broker.get_request(asked.id).history]
    assert history[0] == "routed_by_rule"
    # the same story in /v1/stats
    with TestClient(create_app(Settings(admin_token=ADMIN), broker.config, broker)) as api:
        stats = api.get("/v1/stats", headers=bearer(ADMIN)).json()
    assert stats["requests"]["total"] == 3
    assert stats["requests"]["by_queue"] == {"default": 2, "finance": 1}
    assert stats["requests"]["by_agent"] == {"refunder": 3}
    assert stats["requests"]["by_outcome"] == {"approved": 2, "rejected": 1}
    assert stats["decided_by"] == {"person": 1, "rule": 2, "timeout": 0}
    assert stats["rule_hits"] == {"big": 1, "huge": 1, "small": 1}
    assert stats["by_approver"] == {"alice": 1, "bob": 1}
    assert stats["reject_reasons"] == [{"reason": "Refunds over 5,000 need the CFO.", "count": 1}]
