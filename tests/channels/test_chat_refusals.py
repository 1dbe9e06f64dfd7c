"""A refused click on any chat (Slack, Telegram, Discord, Teams) tells the clicker why in words
that carry nothing of the request: no tool, arguments or prompt, no queue, role or channel name
(REST answers the same caller 404, or a 403 to one who may see the request). Teams answers with
a card that holds the refusal alone. Nothing is decided.

One config serves all four chats: `frontdesk` is decided in every chat's home channel, `treasury`
(role finance) in each chat's money channel, `backoffice` in the inbox only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import NewRequest, Request
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.cards import button_tokens as tokens
from channels.slack import action_ids as slack_ids
from tests.support.chat_setup import (  # noqa: F401 - fixtures
    ALICE_DC,
    ALICE_TG,
    BOB_DC,
    BOB_TG,
    DC_CHANNEL,
    DC_OTHER_CHANNEL,
    EVE_DC,
    EVE_TG,
    TG_CHAT,
    TG_OTHER_CHAT,
    dc_post,
    discord_section,
    fake_discord,
    fake_telegram,
    telegram_section,
    tg_post,
)
from tests.support.fakes.discord import FakeDiscord
from tests.support.fakes.teams import FakeConnector
from tests.support.fakes.telegram import FakeTelegram
from tests.support.slack_api import SIGNING_SECRET, FakeSlack, click, send, signed
from tests.support.teams_setup import (
    ALICE,
    BOB,
    CONVERSATION,
    MALLORY,
    TENANT,
    fake_connector,  # noqa: F401 - the connector fixture
    invoke,
)

TEAMS_MONEY = "19:treasury-room@thread.tacv2"
TEAMS_ELSEWHERE = "19:somewhere-else@thread.tacv2"
TOOL, IBAN, PROMPT = "wire_funds_zq", "DE00SECRET1234", "Move the reserve, code PROMPTZQ"
NEVER_SHOWN = [
    TOOL,
    IBAN,
    "PROMPTZQ",
    "reserve",
    "frontdesk",
    "treasury",
    "backoffice",
    "finance",
    "inbox",
    "slack:",
    "telegram:",
    "discord:",
    "teams:",
]
"""What a refused clicker must not read: the request's tool, args and prompt, queue names, roles
and channel names."""

PEOPLE = {  # per platform: who clicks
    "slack": {"alice": "U_ALICE", "bob": "U_BOB", "stranger": "U_STRANGER"},
    "telegram": {"alice": ALICE_TG, "bob": BOB_TG, "stranger": EVE_TG},
    "discord": {"alice": ALICE_DC, "bob": BOB_DC, "stranger": EVE_DC},
    "teams": {"alice": ALICE, "bob": BOB, "stranger": MALLORY},
}
PLACES = {  # per platform: where the click comes from
    "slack": {"home": "C1", "money": "C2", "elsewhere": "C_UNKNOWN"},
    "telegram": {"home": TG_CHAT, "money": TG_OTHER_CHAT, "elsewhere": -1005555555555},
    "discord": {"home": DC_CHANNEL, "money": DC_OTHER_CHANNEL, "elsewhere": "1000000000000000099"},
    "teams": {"home": CONVERSATION, "money": TEAMS_MONEY, "elsewhere": TEAMS_ELSEWHERE},
}


def config_for(
    slack: FakeSlack, telegram: FakeTelegram, discord: FakeDiscord, connector: FakeConnector
) -> dict[str, Any]:
    home = ["slack:approvals", "telegram:ops", "discord:ops", "teams:approvals"]
    money = ["slack:money", "telegram:money", "discord:money", "teams:money"]
    teams_channel = {"service_url": connector.url, "tenant_id": TENANT}
    return {
        "queues": {
            "frontdesk": {"channels": home},
            "treasury": {"channels": money, "roles": ["finance"]},
            "backoffice": {"channels": ["inbox"]},
        },
        "slack": {
            "bot_token": "xoxb-test",
            "signing_secret": SIGNING_SECRET,
            "api_base_url": f"{slack.url}/api",
            "channels": {"approvals": {"channel": "C1"}, "money": {"channel": "C2"}},
        },
        "telegram": telegram_section(telegram, ops=TG_CHAT, money=TG_OTHER_CHAT),
        "discord": discord_section(discord, ops=DC_CHANNEL, money=DC_OTHER_CHANNEL),
        "teams": {
            "allow_anonymous": True,
            "channels": {
                "approvals": {**teams_channel, "conversation_id": CONVERSATION},
                "money": {**teams_channel, "conversation_id": TEAMS_MONEY},
            },
        },
        "approvers": {
            name: {
                "roles": ["finance"] if name == "alice" else ["ops"],
                "slack_user_id": PEOPLE["slack"][name],
                "telegram_user_id": PEOPLE["telegram"][name],
                "discord_user_id": PEOPLE["discord"][name],
                "teams_user_id": PEOPLE["teams"][name],
            }
            for name in ("alice", "bob")
        },
    }


@pytest.fixture
def chats(
    redis: Redis,
    fake_slack: FakeSlack,
    telegram: FakeTelegram,
    discord: FakeDiscord,
    connector: FakeConnector,
) -> Iterator[tuple[Broker, TestClient, FakeDiscord, FakeTelegram]]:
    config = parse_config(config_for(fake_slack, telegram, discord, connector))
    broker = Broker(redis, config, prefix="cr:")
    with TestClient(create_app(Settings(), config, broker)) as client:
        yield broker, client, discord, telegram


def secret_request(broker: Broker, queue: str) -> Request:
    return broker.create_request(
        NewRequest(tool_name=TOOL, args={"iban": IBAN, "amount": 9000}, prompt=PROMPT, queue=queue)
    )


def click_on(
    chats: tuple[Broker, TestClient, FakeDiscord, FakeTelegram],
    platform: str,
    request_id: str,
    verb: str,
    who: str,
    where: str,
) -> tuple[int, Any]:
    """Click `verb` (approve or reject) on the request's card as `who` from `where`."""
    _, client, discord, telegram = chats
    user, place = PEOPLE[platform][who], PLACES[platform][where]
    if platform == "slack":
        action = slack_ids.APPROVE if verb == "approve" else slack_ids.REJECT
        resp = send(client, *signed(click(action, request_id, user=user, channel=place)))
    elif platform == "telegram":
        token = tokens.token(tokens.APPROVE if verb == "approve" else tokens.REJECT, request_id)
        card = {"message_id": 1, "chat": {"id": place}}
        resp = tg_post(client, telegram.click(card, user, token))
    elif platform == "discord":
        token = tokens.token(tokens.APPROVE if verb == "approve" else tokens.REJECT, request_id)
        card = {"id": "1100000000000000999", "channel_id": place}
        resp = dc_post(client, discord, discord.click(card, user, token))
    else:
        resp = client.post(
            "/v1/teams/messages", json=invoke(request_id, verb, user, conversation=place)
        )
    return resp.status_code, resp.json()


def shown(body: Any) -> str:
    """Everything the answer would show (the whole body, as text)."""
    return json.dumps(body, ensure_ascii=False)


def leaks(body: Any) -> list[str]:
    text = shown(body).casefold()
    return [word for word in NEVER_SHOWN if word.casefold() in text]


def assert_refused_without_the_request(platform: str, status: int, body: Any) -> None:
    assert status == 200, body
    assert leaks(body) == [], shown(body)
    if platform == "teams":
        assert body["type"] == "application/vnd.microsoft.card.adaptive"
        assert "actions" not in body["value"]  # a refusal card: nothing to click
    elif platform == "slack":
        assert body["error"] == "forbidden"
    elif platform == "telegram":
        assert body["method"] == "answerCallbackQuery" and body["show_alert"] is True
    else:
        assert body["type"] == 4 and body["data"]["flags"] == 64


SCENARIOS = {  # queue of the request, who clicks, from where
    "a-queue-that-does-not-list-the-chat": ("backoffice", "alice", "home"),
    "a-user-who-is-no-approver": ("frontdesk", "stranger", "home"),
    "a-role-the-clicker-lacks": ("treasury", "bob", "money"),
    "a-chat-that-is-no-channel": ("frontdesk", "alice", "elsewhere"),
    "a-chat-of-another-queue": ("treasury", "alice", "home"),
}


@pytest.mark.parametrize("verb", ["approve", "reject"])
@pytest.mark.parametrize("scenario", list(SCENARIOS.values()), ids=list(SCENARIOS))
@pytest.mark.parametrize("platform", ["slack", "telegram", "discord", "teams"])
def test_a_refused_click_tells_why_without_the_request(
    chats: tuple[Broker, TestClient, FakeDiscord, FakeTelegram],
    platform: str,
    scenario: tuple[str, str, str],
    verb: str,
) -> None:
    broker = chats[0]
    queue, who, where = scenario
    request = secret_request(broker, queue)
    status, body = click_on(chats, platform, request.id, verb, who, where)
    assert_refused_without_the_request(platform, status, body)
    after = broker.get_request(request.id)
    assert after.is_pending and after.approvals == [] and after.history == request.history


def test_a_teams_click_from_another_tenant_gets_a_card_without_the_request(
    chats: tuple[Broker, TestClient, FakeDiscord, FakeTelegram],
) -> None:
    broker, client, _, _ = chats
    request = secret_request(broker, "frontdesk")
    activity = invoke(request.id, "approve", ALICE)
    activity["conversation"]["tenantId"] = "someone-elses-tenant"
    activity["channelData"]["tenant"]["id"] = "someone-elses-tenant"
    resp = client.post("/v1/teams/messages", json=activity)
    assert_refused_without_the_request("teams", resp.status_code, resp.json())
    assert broker.get_request(request.id).is_pending


def test_a_click_on_a_request_that_does_not_exist_names_nothing_but_what_was_sent(
    chats: tuple[Broker, TestClient, FakeDiscord, FakeTelegram],
) -> None:
    for platform in PEOPLE:
        status, body = click_on(chats, platform, "req_doesnotexist", "approve", "alice", "home")
        assert status == 200 and leaks(body) == [], (platform, body)


@pytest.mark.parametrize("platform", ["slack", "telegram", "discord", "teams"])
def test_an_approver_who_may_decide_still_sees_the_request_after_a_refusal(
    chats: tuple[Broker, TestClient, FakeDiscord, FakeTelegram], platform: str
) -> None:
    """The refusal hides the request only from those who may not decide it: alice's own late
    click hears who decided first."""
    broker = chats[0]
    request = secret_request(broker, "frontdesk")
    assert click_on(chats, platform, request.id, "approve", "bob", "home")[0] == 200
    status, body = click_on(chats, platform, request.id, "approve", "alice", "home")
    assert status == 200 and "already approved by bob" in shown(body), body
