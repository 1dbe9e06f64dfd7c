"""Telegram and Discord end to end with a REAL agent run on the fleet (RQ SimpleWorker and the
resumer in this process, a real Redis, a running notifier, the API in-process), against local
fakes of Slack, the Telegram Bot API and Discord: the run pauses, every channel gets a card,
a click on one platform decides through the one judge, the run resumes and finishes, and every
other platform's copy is edited to show who decided (one card kept in sync)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import Request, RunStatus, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.starting import run_queue, start_run
from channels.cards import button_tokens as ids
from tests.support.chat_setup import (  # noqa: F401 - fixtures
    ALICE_DC,
    ALICE_TG,
    TG_CHAT,
    dc_post,
    discord_section,
    fake_discord,
    fake_telegram,
    people,
    telegram_section,
    tg_post,
)
from tests.support.fakes.discord import FakeDiscord, custom_ids
from tests.support.fakes.harness import running
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.telegram import FakeTelegram, buttons
from tests.support.jobs import jobs_bound_to, work
from tests.support.notifier_setup import slack_section
from tests.support.waiting import wait_for
from workers.resumer import Resumer

ADMIN = "admin-token-for-the-chat-channels-fleet"


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask to refund once; then say what the tool answered."""
    returns = [p for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return"]
    if returns:
        return ModelResponse(parts=[TextPart(f"refund: {returns[0].content}")])
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1", "amount": 40})])


agent: Agent[None, str | DeferredToolRequests] = Agent(
    FunctionModel(_script), output_type=[str, DeferredToolRequests]
)


@agent.tool_plain(requires_approval=True)
def refund(order: str, amount: int) -> str:
    return f"refunded {amount} on {order}"


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    fake = FakeSlack().start()
    yield fake
    fake.stop()


@pytest.fixture
def fleet(
    redis: Redis, slack: FakeSlack, telegram: FakeTelegram, discord: FakeDiscord
) -> Iterator[tuple[Broker, TestClient]]:
    config = parse_config(
        {
            "queues": {"default": {"channels": ["slack:approvals", "telegram:ops", "discord:ops"]}},
            "slack": slack_section(slack),
            "telegram": telegram_section(telegram),
            "discord": discord_section(discord),
            "approvers": people(),
            "agents": {"refunder": {"path": f"{__name__}:agent"}},
        }
    )
    with jobs_bound_to(Broker(redis, config, prefix="t:")) as broker:
        with TestClient(create_app(Settings(admin_token=ADMIN), config, broker)) as client:
            yield broker, client


def settle(broker: Broker) -> None:
    """Resume what the outbox says and run every queued job, until nothing is left."""
    resumer = Resumer(broker, consumer="test-resumer", block_ms=None)
    for _ in range(20):
        resumer.run_once()
        if run_queue(broker).count == 0:
            return
        work(broker)
    raise AssertionError("the fleet never settled")


def paused_request(broker: Broker, run_id: str) -> Request:
    settle(broker)
    run = broker.get_run(run_id)
    assert run.status is RunStatus.waiting, run.error
    [request] = broker.get_requests(run.pending)
    return request


def cards_posted(slack: FakeSlack, telegram: FakeTelegram, discord: FakeDiscord, rid: str) -> bool:
    return bool(slack.posts_for(rid) and telegram.cards_for(rid) and discord.cards_for(rid))


def shows_decided(slack: FakeSlack, telegram: FakeTelegram, discord: FakeDiscord, rid: str) -> bool:
    """Every copy says approved by alice, and none has buttons left."""
    message = slack.message_for(rid) or {}
    in_slack = "approved" in str(message.get("text")) and "actions" not in str(
        message.get("blocks")
    )
    [tg] = telegram.cards_for(rid) or [{}]
    [dc] = discord.cards_for(rid) or [{}]
    return (
        in_slack
        and "Approved by alice" in tg.get("text", "")
        and not buttons(tg)
        and "Approved by alice" in dc.get("content", "")
        and not custom_ids(dc)
    )


@pytest.mark.parametrize("platform", ["telegram", "discord"])
def test_a_click_on_one_platform_resumes_the_run_and_updates_every_copy(
    fleet: tuple[Broker, TestClient],
    slack: FakeSlack,
    telegram: FakeTelegram,
    discord: FakeDiscord,
    platform: str,
) -> None:
    broker, client = fleet
    with running(broker):
        run = start_run(broker, "refunder", f"refund A1 (decided on {platform})")
        request = paused_request(broker, run.id)
        wait_for(lambda: cards_posted(slack, telegram, discord, request.id))
        approve = ids.token(ids.APPROVE, request.id)
        if platform == "telegram":
            [card] = telegram.cards_for(request.id)
            assert approve in buttons(card)
            resp = tg_post(client, telegram.click(card, ALICE_TG, approve))
            assert resp.status_code == 200, resp.text
            assert resp.json()["method"] == "answerCallbackQuery"
            assert resp.json()["show_alert"] is False
        else:
            [card] = discord.cards_for(request.id)
            assert approve in custom_ids(card)
            resp = dc_post(client, discord, discord.click(card, ALICE_DC, approve))
            assert resp.status_code == 200, resp.text
            assert resp.json() == {"type": 6}  # deferred update: the notifier edits the card
        decided = broker.get_request(request.id)
        assert decided.status is Status.approved
        assert decided.decision is not None and decided.decision.decided_by == "alice"
        settle(broker)
        finished = broker.get_run(run.id)
        assert finished.status is RunStatus.finished, finished.error
        assert finished.output == "refund: refunded 40 on A1"
        wait_for(lambda: shows_decided(slack, telegram, discord, request.id))
    assert broker.dead_letters() == []
    assert len(telegram.calls_to("sendMessage", ok_only=True)) == 1
    assert len(discord.calls_to("create", ok_only=True)) == 1
    assert str(TG_CHAT) in {str(c.params["chat_id"]) for c in telegram.calls_to("sendMessage")}


@pytest.mark.parametrize("platform", ["telegram", "discord"])
def test_always_offers_the_suggested_rules_and_a_click_approves_and_keeps_one(
    fleet: tuple[Broker, TestClient],
    slack: FakeSlack,
    telegram: FakeTelegram,
    discord: FakeDiscord,
    platform: str,
) -> None:
    broker, client = fleet
    with running(broker):
        run = start_run(broker, "refunder", f"refund A1 (always, on {platform})")
        request = paused_request(broker, run.id)
        assert request.suggested_rules
        wait_for(lambda: cards_posted(slack, telegram, discord, request.id))
        always = ids.token(ids.ALWAYS, request.id)
        keep = ids.token(ids.ALWAYS_RULE, request.id, 0)
        if platform == "telegram":
            [card] = telegram.cards_for(request.id)
            tg_post(client, telegram.click(card, ALICE_TG, always))
            offer = telegram.calls_to("sendMessage", ok_only=True)[-1].response["result"]
            assert keep in buttons(offer)
            answer = tg_post(client, telegram.click(offer, ALICE_TG, keep)).json()
            assert answer["text"] == "Done: approved."
        else:
            [card] = discord.cards_for(request.id)
            offer = dc_post(client, discord, discord.click(card, ALICE_DC, always)).json()
            assert offer["data"]["flags"] == 64 and keep in custom_ids(offer["data"])
            assert dc_post(client, discord, discord.click(card, ALICE_DC, keep)).json() == {
                "type": 6
            }
        decided = broker.get_request(request.id)
        assert decided.status is Status.approved and decided.decision is not None
        [rule] = broker.requests.rules.list()  # the rule kept with the decision
        assert rule.run_id == run.id and rule.created_by == "alice"
        settle(broker)
        assert broker.get_run(run.id).status is RunStatus.finished
        wait_for(lambda: shows_decided(slack, telegram, discord, request.id))
