"""Microsoft Teams end to end: a real agent run on the fleet asks for approval, the notifier posts
its Adaptive Card to a fake Bot Connector, a click (`Action.Execute` invoke) at
`POST /v1/teams/messages` decides through the one decision service, the run resumes and the
card shows the outcome: in the invoke response for the clicker, and updated (PUT) for everyone.

The API runs the Microsoft 365 Agents SDK in its anonymous mode (no app id: what a local
emulator talks to); one test checks that with an app id an unsigned activity is refused.
Agent jobs run in this process (`tests.support.jobs.work`), the notifier in threads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
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

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import Decision, NewRequest, Outcome, Request, RunStatus, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.outbox import Resumer
from broker.runs.starting import start_run
from channels.retry import GiveUp, Retry
from channels.teams import adaptive_cards as teams_cards
from channels.teams.config import teams_section
from channels.teams.sender import TeamsCalls, TeamsCopy, card_activity, update_teams_copy
from tests.support.fakes.harness import running
from tests.support.fakes.teams import FakeConnector
from tests.support.jobs import jobs_bound_to, work
from tests.support.teams_setup import (  # noqa: F401 - the connector fixture
    ADMIN,
    ALICE,
    BOB,
    CONVERSATION,
    MALLORY,
    TENANT,
    app_id_config,
    card_text,
    fake_connector,
    invoke,
    teams_config,
)
from tests.support.waiting import wait_for


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
    return f"refunded {amount}"


@pytest.fixture
def fleet(redis: Redis, connector: FakeConnector) -> Iterator[tuple[Broker, TestClient]]:
    config = teams_config(connector)
    with jobs_bound_to(Broker(redis, config, prefix="tt:")) as broker:
        register_agent(broker, "refunds", f"{__name__}:agent")
        with TestClient(create_app(Settings(admin_token=ADMIN), config, broker)) as client:
            yield broker, client


def click(client: TestClient, activity: dict[str, Any]) -> dict[str, Any]:
    """POST the invoke; the invoke response's body (type and card)."""
    resp = client.post("/v1/teams/messages", json=activity)
    assert resp.status_code == 200, resp.text
    return resp.json()


def waiting(broker: Broker, run_id: str) -> Request:
    work(broker)
    run = broker.get_run(run_id)
    assert run.status is RunStatus.waiting, run.error
    [request] = broker.get_requests(run.pending)
    return request


# ---- end to end ----------------------------------------------------------------------------


def test_a_click_on_approve_in_teams_resumes_the_run_and_refreshes_the_card(
    fleet: tuple[Broker, TestClient], connector: FakeConnector
) -> None:
    broker, client = fleet
    with running(broker, teams_timeout_s=5.0):
        run = start_run(broker, "refunds", "refund order 42")
        request = waiting(broker, run.id)
        [(activity_id, card)] = wait_for(lambda: connector.cards_for(request.id))
        verbs = [a["verb"] for a in card["actions"]]
        assert verbs == ["approve", "reject"]
        assert {a["data"]["request_id"] for a in card["actions"]} == {request.id}

        answer = click(client, invoke(request.id, "approve"))

        assert answer["statusCode"] == 200
        assert answer["type"] == "application/vnd.microsoft.card.adaptive"
        assert "Approved by alice" in card_text(answer["value"])
        assert "actions" not in answer["value"]  # nothing left to click
        assert broker.get_request(request.id).status is Status.approved
        Resumer(broker, consumer="test", min_idle_ms=0, block_ms=None).run_once()
        work(broker)
        finished = broker.get_run(run.id)
        assert finished.status is RunStatus.finished, finished.error
        assert finished.output == "refunded 120.0"
        # everyone's copy: the notifier saw the decision and updated the posted card in place
        wait_for(lambda: connector.count("PUT", 200) >= 1)
        [(same_id, updated)] = connector.cards_for(request.id)
        assert same_id == activity_id
        assert "Approved by alice" in card_text(updated)
    metrics = client.get("/metrics").text
    assert 'approval_broker_deliveries_total{channel="teams"}' in metrics
    assert 'approval_broker_decision_latency_seconds_count{channel="teams"} 1.0' in metrics


def test_a_reject_needs_a_reason_and_tells_the_agent_it(
    fleet: tuple[Broker, TestClient],
) -> None:
    broker, client = fleet
    run = start_run(broker, "refunds", "refund order 43")
    request = waiting(broker, run.id)

    empty = click(client, invoke(request.id, "reject", reason="  "))
    assert "Type a reason first" in card_text(empty["value"])
    assert broker.get_request(request.id).is_pending

    done = click(client, invoke(request.id, "reject", reason="duplicate\u202e order"))
    assert "Rejected by alice" in card_text(done["value"])
    decision = broker.get_request(request.id).decision
    assert decision is not None and decision.reason == "duplicate order"  # bidi control gone


def test_someone_who_is_no_approver_is_refused_on_the_card(
    fleet: tuple[Broker, TestClient],
) -> None:
    broker, client = fleet
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 1}))

    answer = click(client, invoke(request.id, "approve", user=MALLORY))

    assert "is not an approver here" in card_text(answer["value"])
    # the refusal alone: nothing of the request (tests/channels/test_chat_refusals.py)
    assert "actions" not in answer["value"]
    assert "refund" not in json.dumps(answer)
    assert broker.get_request(request.id).is_pending


def test_a_click_on_a_decided_request_says_who_decided_and_changes_nothing(
    fleet: tuple[Broker, TestClient],
) -> None:
    broker, client = fleet
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 2}))
    click(client, invoke(request.id, "approve", user=BOB))

    late = click(client, invoke(request.id, "reject", reason="no"))

    assert "already approved by bob" in card_text(late["value"])
    after = broker.get_request(request.id)
    assert after.status is Status.approved and after.decision.decided_by == "bob"  # type: ignore[union-attr]


def test_a_replayed_invoke_records_nothing(fleet: tuple[Broker, TestClient]) -> None:
    broker, client = fleet
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 3}, queue="two"))
    activity = invoke(request.id, "approve", activity_id="f:replayed")
    first = click(client, activity)
    assert "1 of 2 approvals: alice" in card_text(first["value"])

    again = click(client, activity)

    assert "1 of 2 approvals: alice" in card_text(again["value"])
    assert len(broker.get_request(request.id).approvals) == 1


def test_alice_on_teams_and_alice_on_rest_are_one_vote(
    fleet: tuple[Broker, TestClient],
) -> None:
    broker, client = fleet
    request = broker.create_request(
        NewRequest(tool_name="refund", args={"amount": 10}, queue="two")
    )
    click(client, invoke(request.id, "approve"))

    resp = client.post(
        f"/v1/requests/{request.id}/decision",
        json={"outcome": "approved"},
        headers={"Authorization": "Bearer tok-alice"},
    )
    assert resp.status_code == 200
    assert [v.by for v in broker.get_request(request.id).approvals] == ["alice"]

    answer = click(client, invoke(request.id, "approve", user=BOB))
    assert "Approved by bob" in card_text(answer["value"])


def test_a_structured_question_is_answered_on_the_card(fleet: tuple[Broker, TestClient]) -> None:
    broker, client = fleet
    questions = [
        {
            "question": "Which auth method?",
            "header": "Auth",
            "options": [{"label": "OAuth 2.0"}, {"label": "API key"}],
        },
        {
            "question": "Which scopes?",
            "header": "Scopes",
            "multi_select": True,
            "options": [{"label": "read"}, {"label": "write"}, {"label": "admin"}],
        },
    ]
    request = broker.create_request(
        NewRequest(tool_name="setup", kind="question", metadata={"questions": questions})
    )
    card = teams_cards.render(request, broker.config, "teams:approvals")
    ids = [e.get("id") for e in card["body"] if e.get("id")]
    assert ids == ["q0", "q0_other", "q1", "q1_other", "reason"]

    click(client, invoke(request.id, "answer", q0="1", q1="0,2", q1_other="billing"))

    decision = broker.get_request(request.id).decision
    assert decision is not None and decision.answer == {
        "answers": [
            {"question": "Which auth method?", "selected": ["API key"], "other": None},
            {"question": "Which scopes?", "selected": ["read", "admin"], "other": "billing"},
        ]
    }


def test_an_open_question_with_options_is_answered_by_the_choice(
    fleet: tuple[Broker, TestClient],
) -> None:
    broker, client = fleet
    request = broker.create_request(
        NewRequest(tool_name="ship", kind="question", metadata={"options": ["card", "credit"]})
    )
    empty = click(client, invoke(request.id, "answer"))
    assert "pick an answer first" in card_text(empty["value"])

    done = click(client, invoke(request.id, "answer", answer="credit"))

    assert 'Answer: "credit"' in card_text(done["value"])
    assert broker.get_request(request.id).decision.answer == "credit"  # type: ignore[union-attr]


def test_a_click_from_a_conversation_that_is_no_channel_of_the_queue_decides_nothing(
    fleet: tuple[Broker, TestClient],
) -> None:
    broker, client = fleet
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 4}))

    answer = click(client, invoke(request.id, "approve", conversation="19:other@thread.tacv2"))

    assert "not one of the broker's Teams channels" in card_text(answer["value"])
    assert broker.get_request(request.id).is_pending


def test_a_click_from_another_tenant_decides_nothing(fleet: tuple[Broker, TestClient]) -> None:
    broker, client = fleet
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 12}))
    activity = invoke(request.id, "approve")
    activity["conversation"]["tenantId"] = "someone-elses-tenant"

    answer = click(client, activity)

    assert "not one of the broker's Teams channels" in card_text(answer["value"])
    assert broker.get_request(request.id).is_pending


def test_without_teams_configured_the_route_is_a_404_with_an_error_body(
    api_broker: Broker, cfg: Config, client: TestClient
) -> None:
    resp = client.post("/v1/teams/messages", json={"type": "message"})
    assert resp.status_code == 404
    assert resp.json()["error"] == "not_configured"


def test_a_body_that_is_no_activity_is_a_400_with_an_error_body(
    fleet: tuple[Broker, TestClient],
) -> None:
    _, client = fleet
    resp = client.post("/v1/teams/messages", content=b"{not json")
    assert resp.status_code == 400
    assert resp.json()["error"] == "bad_request"
    resp = client.post("/v1/teams/messages", json={"type": "message"})
    assert resp.status_code == 400 and "conversation.id" in resp.json()["detail"]


def test_a_message_to_the_bot_is_accepted_and_posts_nothing(
    fleet: tuple[Broker, TestClient], connector: FakeConnector
) -> None:
    _, client = fleet
    activity = {
        "type": "message",
        "id": "m1",
        "text": "hello",
        "channelId": "msteams",
        "serviceUrl": connector.url,
        "from": {"id": f"29:{ALICE}", "aadObjectId": ALICE},
        "recipient": {"id": "28:bot"},
        "conversation": {"id": CONVERSATION},
    }
    resp = client.post("/v1/teams/messages", json=activity)
    assert resp.status_code == 202
    assert connector.calls == []  # no typing indicator, no reply


# ---- authentication ----------------------------------------------------------------------


def test_an_unsigned_activity_is_refused_when_the_bot_has_an_app_id(
    redis: Redis, connector: FakeConnector
) -> None:
    config = app_id_config(connector)
    broker = Broker(redis, config, prefix="tu:")
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    with TestClient(create_app(Settings(admin_token=ADMIN), config, broker)) as client:
        unsigned = client.post("/v1/teams/messages", json=invoke(request.id, "approve"))
        forged = client.post(
            "/v1/teams/messages",
            json=invoke(request.id, "approve"),
            headers={"Authorization": "Bearer not.a.jwt"},
        )
    assert unsigned.status_code == 401
    assert set(unsigned.json()) == {"error", "detail"}
    assert forged.status_code == 401 and forged.json()["error"] == "unauthorized"
    assert broker.get_request(request.id).is_pending


def test_teams_without_an_app_id_must_ask_for_anonymous_mode() -> None:
    with pytest.raises(ConfigError, match="allow_anonymous"):
        parse_config({"teams": {"channels": {}}})
    with pytest.raises(ConfigError, match="app_password"):
        parse_config({"teams": {"app_id": "x"}})


def test_two_approvers_with_one_teams_user_are_refused() -> None:
    with pytest.raises(ConfigError, match="same teams user id"):
        parse_config(
            {
                "approvers": {
                    "alice": {"teams_user_id": ALICE},
                    "alicia": {"teams_user_id": ALICE.upper()},
                }
            }
        )


API_CONFIG: dict = {}
"""The config of the API tests' `client` fixture: no [teams]."""


# ---- the card and the notifier -------------------------------------------------------------


def test_requester_text_on_the_card_is_literal_and_without_bidi_controls(
    redis: Redis, connector: FakeConnector
) -> None:
    config = teams_config(connector)
    broker = Broker(redis, config, prefix="tx:")
    prompt = "pay [bank.com](https://evil.example) wire\u202emoney"
    request = broker.create_request(
        NewRequest(tool_name="refund", args={"amount": 6}, prompt=prompt)
    )
    card = teams_cards.render(request, config, "teams:approvals")
    blocks = [e for e in card["body"] if e["type"] == "TextBlock"]
    assert blocks == []  # TextBlock reads markdown; every text is a TextRun
    assert "pay [bank.com](https://evil.example) wiremoney" in card_text(card)


def test_a_rate_limited_post_waits_for_retry_after_and_then_posts(
    redis: Redis, connector: FakeConnector
) -> None:
    broker = Broker(redis, teams_config(connector), prefix="tr:")
    connector.fail("POST", 429, retry_after=1)
    with running(broker, teams_timeout_s=5.0):
        request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 7}))
        wait_for(lambda: connector.cards_for(request.id))
    posts = [c for c in connector.calls if c.method == "POST"]
    assert [c.status for c in posts] == [429, 201]
    assert posts[1].at - posts[0].at >= 1.0  # not before Retry-After


def test_a_post_that_keeps_failing_goes_to_the_dead_letters(
    redis: Redis, connector: FakeConnector
) -> None:
    broker = Broker(redis, teams_config(connector), prefix="td:")
    connector.fail("POST", 503, times=50)
    with running(broker, teams_timeout_s=5.0, max_attempts=3):
        request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 8}))
        letters = wait_for(lambda: broker.dead_letters())
    [(_, letter)] = letters
    assert letter.get("channel") == "teams:approvals"
    assert request.id in json.dumps(letter)
    assert connector.count("POST", 503) == 3


def test_update_teams_copy_edits_a_posted_card_to_the_outcome(
    redis: Redis, connector: FakeConnector
) -> None:
    config = teams_config(connector)
    broker = Broker(redis, config, prefix="tc:")
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 9}))
    calls = TeamsCalls(teams_section(config), timeout_s=5.0)  # type: ignore[arg-type]
    target = teams_section(config).channels["approvals"]  # type: ignore[union-attr]
    activity_id = calls.post(target, card_activity(request, config, "teams:approvals", TENANT))
    decided = broker.decide(
        request.id, Decision(outcome=Outcome.rejected, reason="too much"), decided_by="bob"
    )
    copy = TeamsCopy("teams:approvals", target, activity_id)

    assert update_teams_copy(calls, config, copy, decided) == f"updated {activity_id}"
    [(_, card)] = connector.cards_for(request.id)
    assert "Rejected by bob" in card_text(card) and "Reason: too much" in card_text(card)
    gone = TeamsCopy("teams:approvals", target, "1:999")
    with pytest.raises(GiveUp):
        update_teams_copy(calls, config, gone, decided)
    connector.fail("PUT", 429, retry_after=2)
    with pytest.raises(Retry) as slow:
        update_teams_copy(calls, config, copy, decided)
    assert slow.value.retry_after == 2


def test_the_teams_app_manifest_names_one_bot_and_the_api_host() -> None:
    root = Path(__file__).resolve().parents[3] / "deploy" / "teams"
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["manifestVersion"] == "1.17"
    [bot] = manifest["bots"]
    assert bot["botId"] == manifest["id"]  # the app and its bot are one registration
    assert set(bot["scopes"]) >= {"team", "groupChat"}
    assert manifest["icons"] == {"outline": "outline.png", "color": "color.png"}
    assert "zip" in (root / "README.md").read_text()  # how to package it with the icons


def test_a_card_left_in_a_queue_escalated_away_from_shows_the_decision_made_in_the_next(
    redis: Redis, connector: FakeConnector
) -> None:
    config = parse_config(
        {
            "queues": {
                "default": {"channels": ["teams:approvals"], "escalate_to": "managers"},
                "managers": {"channels": ["inbox"]},
            },
            "teams": {
                "allow_anonymous": True,
                "channels": {
                    "approvals": {"service_url": connector.url, "conversation_id": CONVERSATION}
                },
            },
        }
    )
    broker = Broker(redis, config, prefix="tx:")
    with running(broker, teams_timeout_s=5.0):
        request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 11}))
        wait_for(lambda: connector.cards_for(request.id))
        broker.decide(
            request.id, Decision(outcome=Outcome.escalated, reason="big"), decided_by="carol"
        )
        wait_for(
            lambda: "Escalated to managers" in card_text(connector.cards_for(request.id)[0][1])
        )
        broker.decide(request.id, Decision(outcome=Outcome.approved), decided_by="alice")

        [(_, card)] = wait_for(
            lambda: [
                c for c in connector.cards_for(request.id) if "Approved by alice" in card_text(c[1])
            ]
        )
    assert "actions" not in card


def test_the_card_left_behind_by_an_escalation_says_where_it_went(
    redis: Redis, connector: FakeConnector
) -> None:
    config = parse_config(
        {
            "queues": {
                "default": {"channels": ["teams:approvals"], "escalate_to": "managers"},
                "managers": {"channels": ["inbox"]},
            },
            "teams": {
                "allow_anonymous": True,
                "channels": {
                    "approvals": {"service_url": connector.url, "conversation_id": CONVERSATION}
                },
            },
        }
    )
    broker = Broker(redis, config, prefix="te:")
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 13}))
    pending = teams_cards.render(request, config, "teams:approvals")
    assert [a["verb"] for a in pending["actions"]] == ["approve", "reject", "escalate"]

    moved = broker.decide(
        request.id, Decision(outcome=Outcome.escalated, reason="too big"), decided_by="carol"
    )
    card = teams_cards.render(moved, config, "teams:approvals")

    assert "Escalated to managers by carol" in card_text(card)
    assert "actions" not in card
