"""Policy rules with REAL agent runs on the fleet (RQ SimpleWorker and the resumer, in this
process) on a real Redis, with the notifier fleet delivering to fake Slack, SMTP and webhook
receivers: config rules approve and deny at create with nobody asked and nothing posted or
mailed; remembering in a 3-call round decides the covered sibling while another person decides
a third (real threads) and the round resumes exactly once; the next round's covered call needs
no person; rules survive a Redis restart (AOF)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis
from refunds_demo import Ledger
from standardwebhooks.webhooks import Webhook

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, NewRequest, Outcome, RunStatus, Status
from broker.domain.principals import Principal
from broker.domain.rules.models import parse_body
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.judge import Judge
from broker.redis.embedded import EmbeddedRedis
from broker.runs.starting import run_queue, start_run
from broker.store.rule_sync import sync_at_start
from tests.support.agents import Recorder, recorder_for
from tests.support.auth import person
from tests.support.fakes.harness import SECRET, running, webhook
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.smtp import SmtpSink
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.jobs import jobs_bound_to, work
from tests.support.notifier_setup import email_section, slack_section
from tests.support.waiting import wait_for
from workers.resumer import Resumer

# ---- a scripted agent that asks for three approvals in one round, then one more ----------


def _trio_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = [p for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return"]
    if not returns:
        return ModelResponse(
            parts=[
                ToolCallPart("refund", {"order": "A1", "amount": 120}),
                ToolCallPart("refund", {"order": "A2", "amount": 80}),
                ToolCallPart("ship", {"order": "A3"}),
            ]
        )
    if len(returns) == 3:
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A4", "amount": 30})])
    return ModelResponse(
        parts=[TextPart("; ".join(f"{p.tool_name}: {p.content}" for p in returns))]
    )


trio = Agent(
    FunctionModel(_trio_script), deps_type=Recorder, output_type=[str, DeferredToolRequests]
)


@trio.tool(requires_approval=True)
def refund(ctx: RunContext[Recorder], order: str, amount: int) -> str:
    ctx.deps.add({"tool": "refund", "order": order})
    return f"refunded {order}"


@trio.tool(requires_approval=True)
def ship(ctx: RunContext[Recorder], order: str) -> str:
    ctx.deps.add({"tool": "ship", "order": order})
    return f"shipped {order}"


# ---- the fleet, driven from the test --------------------------------------------------------


class Fleet:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.resumer = Resumer(broker, consumer="test-resumer", block_ms=None)
        self.enqueued: list[tuple[str | None, int | None]] = []

    def settle(self) -> None:
        for _ in range(20):
            for handled in self.resumer.run_once():
                if handled.action == "enqueued":
                    self.enqueued.append((handled.run_id, handled.round))
            if run_queue(self.broker).count == 0:
                return
            work(self.broker)
        raise AssertionError("the fleet never settled")


def fleet_config(slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver) -> Config:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox", "slack:approvals", "email:leads", "webhook:ops"]}
            },
            "webhooks": {"ops": webhook(receiver.url("/ops"))},
            "slack": slack_section(slack),
            "email": email_section(smtp, lists={"leads": {"to": ["lead@example.com"]}}),
            "approvers": {"alice": {"roles": ["finance"]}, "bob": {"roles": ["finance"]}},
            "agents": {
                "refunds": {"path": "refunds_demo:agent", "deps": "refunds_demo:make_deps"},
                "trio": {
                    "path": "tests.integration.test_rules_fleet:trio",
                    "deps": "tests.support.agents:make_recorder",
                },
            },
            "rules": [
                {
                    "id": "routine-refunds",
                    "effect": "allow",
                    "tool": "issue_refund",
                    "agent": "refunds",
                    "args": {"amount": {"le": 100}},
                },
                {
                    "id": "no-big-refunds",
                    "effect": "deny",
                    "tool": "issue_refund",
                    "args": {"amount": {"gt": 100}},
                    "reason": "Refunds over $100 go to the store manager.",
                },
            ],
        }
    )


@pytest.fixture
def fleet_broker(
    redis: Redis, slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver
) -> Iterator[Broker]:
    broker = Broker(redis, fleet_config(slack, smtp, receiver), prefix="t:")
    sync_at_start(broker.requests.rules)
    with jobs_bound_to(broker):
        yield broker


def stream_read(broker: Broker) -> bool:
    """The notifiers' group has read and acknowledged every entry of the default stream."""
    stream = broker.keys.stream("default")
    last = broker.redis.xrevrange(stream, count=1)
    groups = broker.redis.xinfo_groups(stream) if last else []
    return any(g["last-delivered-id"] == last[0][0] and g["pending"] == 0 for g in groups)


def test_config_rules_approve_and_deny_at_create_and_tell_no_person(
    fleet_broker: Broker, slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver
) -> None:
    broker = fleet_broker
    fleet = Fleet(broker)
    with running(broker):
        ok = start_run(broker, "refunds", "Refund $75 on order A100 because the soles came off.")
        no = start_run(
            broker,
            "refunds",
            "Refund $140 on order A103 because the tent is torn.",
            deps={"customer": "c-2"},
        )
        fleet.settle()
        wait_for(lambda: stream_read(broker))
        wait_for(lambda: len(receiver.accepted("/ops")) == 2)
    done, refused = broker.get_run(ok.id), broker.get_run(no.id)
    assert done.status is RunStatus.finished and done.output["refunded"] is True
    assert refused.status is RunStatus.finished and refused.output["refunded"] is False
    assert "Refunds over $100 go to the store manager." in refused.output["message"]
    assert Ledger(broker.redis, "t:").get("A100") is not None
    assert Ledger(broker.redis, "t:", "c-2").all() == []
    [approved] = broker.round_requests(ok.id, 1)
    [denied] = broker.round_requests(no.id, 1)
    assert approved.decision is not None and approved.decision.decided_by == "rule:routine-refunds"
    assert denied.decision is not None and denied.decision.rule == "no-big-refunds"
    for request in (approved, denied):  # delivered to the webhook only, no person-facing channel
        history = broker.get_request(request.id).history
        assert [(h.event, h.channel) for h in history] == [
            ("decided_by_rule", None),
            ("delivered", "webhook:ops"),
        ]
    assert slack.calls_to("chat.postMessage") == [] and smtp.mails == []
    hooks = receiver.accepted("/ops")
    assert sorted(h.payload["type"] for h in hooks) == ["approval.decided"] * 2
    assert {h.payload["data"]["decision"]["rule"] for h in hooks} == {
        "routine-refunds",
        "no-big-refunds",
    }
    assert sorted(fleet.enqueued) == sorted([(ok.id, 1), (no.id, 1)])  # resumed at once
    # above $150 the demo asks two people (quorum 2): no rule without quorum_bypass decides it
    two = start_run(broker, "refunds", "Refund $200 on order A103.", deps={"customer": "c-3"})
    fleet.settle()
    [asked] = broker.round_requests(two.id, 1)
    assert asked.quorum == 2 and asked.status is Status.pending


def test_remembering_in_a_round_of_three_resumes_once_and_covers_the_next_round(
    fleet_broker: Broker, slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver
) -> None:
    broker = fleet_broker
    fleet = Fleet(broker)
    with running(broker):
        run = start_run(broker, "trio", "go")
        fleet.settle()
        assert broker.get_run(run.id).status is RunStatus.waiting
        a, b, c = broker.round_requests(run.id, 1)
        assert (a.tool_name, b.tool_name, c.tool_name) == ("refund", "refund", "ship")
        wait_for(lambda: all(slack.posts_for(r.id) for r in (a, b, c)))  # people were asked
        alice = Principal("alice", frozenset({"finance"}))
        out: dict[str, Any] = {}
        barrier = threading.Barrier(2)

        def remember() -> None:
            barrier.wait()
            out["remembered"] = Judge(broker).decide(
                a.id, Decision(outcome=Outcome.approved), alice, via=("inbox",), remember=0
            )

        def bob() -> None:
            barrier.wait()
            decision = Decision(outcome=Outcome.rejected, reason="not today")
            out["bob"] = broker.decide(c.id, decision, decided_by="bob")

        threads = [threading.Thread(target=remember), threading.Thread(target=bob)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rule = out["remembered"].rule
        assert out["remembered"].siblings == (b.id,) and rule.run_id == run.id
        fleet.settle()
        [later] = broker.round_requests(run.id, 2)
        wait_for(lambda: stream_read(broker))
        wait_for(
            lambda: any(h.payload["data"]["id"] == later.id for h in receiver.accepted("/ops"))
        )
    finished = broker.get_run(run.id)
    assert finished.status is RunStatus.finished, finished.error
    assert fleet.enqueued == [(run.id, 1), (run.id, 2)]  # each round resumed exactly once
    assert later.decision is not None and later.decision.rule == rule.id
    assert broker.requests.rules.get(rule.id).hits == 2  # b, then the next round's call
    # the next round's call: no person asked, nothing posted or mailed, only announced
    assert slack.posts_for(later.id) == []
    assert not any(later.id in m.part("plain") for m in smtp.mails)
    channels = [h.channel for h in broker.get_request(later.id).history if h.event == "delivered"]
    assert channels == ["webhook:ops"]
    tools = sorted(recorder_for(broker.redis, "t:").all(), key=lambda t: t["order"])
    assert tools == [  # the tools of one step may run in any order
        {"tool": "refund", "order": "A1"},
        {"tool": "refund", "order": "A2"},
        {"tool": "refund", "order": "A4"},
    ]
    assert "not today" in str(finished.output)


def test_rules_survive_a_redis_restart(tmp_path) -> None:
    server = EmbeddedRedis(tmp_path / "data").start()
    try:
        config = parse_config({"queues": {"default": {}}})
        broker = Broker(Redis.from_url(server.url), config)
        rule = broker.requests.rules.create(
            parse_body({"effect": "deny", "tool": "wire", "reason": "never"}), created_by="pat"
        )
        first = broker.create_request(NewRequest(tool_name="wire"))
        assert first.status is Status.rejected
        broker.redis.close()
        server.kill()  # SIGKILL: only what the AOF holds comes back
        server.start()
        broker = Broker(Redis.from_url(server.url), config)
        again = broker.create_request(NewRequest(tool_name="wire"))
        assert again.status is Status.rejected and again.decision.rule == rule.id
        assert broker.requests.rules.get(rule.id).hits == 2
        assert broker.get_request(first.id).decision.reason == "never"
        broker.redis.close()
    finally:
        server.close()


def test_a_question_is_never_decided_by_a_rule_even_when_the_tool_matches(
    fleet_broker: Broker,
) -> None:
    rules = fleet_broker.requests.rules
    rules.create(parse_body({"effect": "allow", "tool": "*"}), created_by="pat")
    asked = fleet_broker.create_request(NewRequest(tool_name="ask", kind="question"))
    assert asked.status is Status.pending and asked.decision is None


# ---- a rule covers only what its creator could decide through the channel it was made in ----

ALICE = "tok-alice-rules-fleet"  # finance, no `policy`


def channels_config() -> Config:
    """`refunds` waits in the inbox's queue, `refunds_web` in one decided only by webhook ops."""
    demo = {"path": "refunds_demo:agent", "deps": "refunds_demo:make_deps"}
    return parse_config(
        {
            "queues": {"default": {"channels": ["inbox"]}, "web": {"channels": ["webhook:ops"]}},
            "webhooks": {"ops": webhook("http://127.0.0.1:9/ops", roles=["finance"])},
            "approvers": {"alice": person(ALICE, ["finance"])},
            "agents": {"refunds": demo, "refunds_web": {**demo, "queue": "web"}},
        }
    )


def reply_headers(body: bytes, msg_id: str) -> dict[str, str]:
    now = datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, body.decode()),
        "content-type": "application/json",
    }


REFUND = "Refund $75 on order A100 because the soles came off."


def test_a_persons_rule_never_approves_a_run_in_a_queue_they_cannot_decide_through(
    redis: Redis,
) -> None:
    config = channels_config()
    broker = Broker(redis, config, prefix="t:")
    alice = {"Authorization": f"Bearer {ALICE}"}
    with jobs_bound_to(broker), TestClient(create_app(Settings(), config, broker)) as api:
        for agent in ("refunds_web", "refunds"):
            made = api.post(
                "/v1/rules",
                json={"effect": "allow", "tool": "issue_refund", "agent": agent},
                headers=alice,
            )
            assert made.status_code == 201, made.text
            assert made.json()["creator_channel"] == "inbox"
        fleet = Fleet(broker)
        web = start_run(broker, "refunds_web", REFUND)
        inbox = start_run(broker, "refunds", REFUND, deps={"customer": "c-2"})
        fleet.settle()
        [asked] = broker.round_requests(web.id, 1)
        assert asked.queue == "web" and asked.status is Status.pending and asked.decision is None
        assert broker.get_run(web.id).status is RunStatus.waiting
        # alice may not decide it herself (only webhook ops decides queue web): nor may her rule
        refused = api.post(
            f"/v1/requests/{asked.id}/decision", json={"outcome": "approved"}, headers=alice
        )
        assert refused.status_code == 403, refused.text
        # the same rule for the agent whose queue she decides through the inbox does decide
        [ruled] = broker.round_requests(inbox.id, 1)
        assert ruled.decision is not None and ruled.decision.rule is not None
        assert broker.get_run(inbox.id).status is RunStatus.finished
    assert broker.get_run(inbox.id).output["refunded"] is True
    assert Ledger(broker.redis, "t:").get("A100") is None  # the web run refunded nothing


def test_a_webhook_endpoints_rule_never_approves_a_run_in_a_queue_it_does_not_decide(
    redis: Redis,
) -> None:
    config = channels_config()
    broker = Broker(redis, config, prefix="t:")
    with jobs_bound_to(broker), TestClient(create_app(Settings(), config, broker)) as api:
        fleet = Fleet(broker)

        def reply(run_id: str, agent: str, msg_id: str) -> None:
            [asked] = broker.round_requests(run_id, 1)
            body = json.dumps(
                {
                    "request_id": asked.id,
                    "outcome": "approved",
                    "remember": {"tool": "issue_refund", "agent": agent},
                }
            ).encode()
            resp = api.post(
                "/v1/webhooks/ops/replies", content=body, headers=reply_headers(body, msg_id)
            )
            assert resp.status_code == 200, resp.text

        first = start_run(broker, "refunds_web", REFUND)
        fleet.settle()
        reply(first.id, "refunds", "msg_rule_wide")  # a rule for the inbox's queue: not its own
        second = start_run(broker, "refunds_web", REFUND, deps={"customer": "c-3"})
        fleet.settle()
        reply(second.id, "refunds_web", "msg_rule_own")  # a rule for its own queue
        fleet.settle()
        other = start_run(broker, "refunds", REFUND, deps={"customer": "c-2"})
        own = start_run(broker, "refunds_web", REFUND, deps={"customer": "c-4"})
        fleet.settle()
        [asked] = broker.round_requests(other.id, 1)
        assert asked.queue == "default" and asked.status is Status.pending
        assert asked.decision is None  # the endpoint's rule does not reach the inbox's queue
        [ruled] = broker.round_requests(own.id, 1)
        assert ruled.decision is not None and ruled.decision.decided_by.startswith("rule:")
    rules = {r.agent: r for r in broker.requests.rules.list()}
    assert rules["refunds"].creator_channel == "webhook:ops"
    assert broker.get_run(own.id).status is RunStatus.finished
