"""One card kept in sync (`channels.copies`): a copy posted in a queue the request has since
left is still edited when the request is decided elsewhere; Slack, Telegram and Discord
copies alike. Real Redis, a running notifier, the fakes of the three platforms."""

from __future__ import annotations

from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Outcome, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.cards import button_tokens as ids
from tests.support.chat_setup import (  # noqa: F401 - fixtures
    ALICE_DC,
    ALICE_TG,
    BOB_DC,
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
from tests.support.notifier_setup import fake_slack, settled, slack_section  # noqa: F401 - fixtures
from tests.support.waiting import wait_for


def test_copies_left_behind_by_an_escalation_show_the_decision_made_in_the_next_queue(
    redis: Redis, slack: FakeSlack, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    config = parse_config(
        {
            "queues": {
                "default": {
                    "channels": ["slack:approvals", "telegram:ops"],
                    "escalate_to": "leads",
                },
                "leads": {"channels": ["discord:leads"]},
            },
            "slack": slack_section(slack),
            "telegram": telegram_section(telegram),
            "discord": discord_section(discord, leads="1000000000000000009"),
            "approvers": people(),
        }
    )
    broker = Broker(redis, config, prefix="t:")
    with running(broker), TestClient(create_app(Settings(), config, broker)) as client:
        rid = broker.create_request(NewRequest(tool_name="refund", args={"amount": 40})).id
        wait_for(lambda: slack.posts_for(rid) and telegram.cards_for(rid))
        broker.decide(rid, Decision(outcome=Outcome.escalated, target="leads"), decided_by="alice")
        wait_for(lambda: discord.cards_for(rid))
        wait_for(lambda: "Escalated to leads" in telegram.cards_for(rid)[0]["text"])
        assert buttons(telegram.cards_for(rid)[0]) == []  # the old chat decides nothing now
        [card] = discord.cards_for(rid)
        resp = dc_post(client, discord, discord.click(card, BOB_DC, ids.token(ids.APPROVE, rid)))
        assert resp.json() == {"type": 6}
        assert broker.get_request(rid).status is Status.approved
        wait_for(lambda: "Approved by bob" in telegram.cards_for(rid)[0]["text"])
        wait_for(lambda: "approved" in str((slack.message_for(rid) or {}).get("text")))
        wait_for(lambda: "Approved by bob" in discord.cards_for(rid)[0]["content"])
        wait_for(lambda: settled(broker, "leads"))
    assert custom_ids(discord.cards_for(rid)[0]) == []
    assert broker.dead_letters() == []
    # each copy was posted once and only edited afterwards
    assert len(telegram.calls_to("sendMessage")) == 1 and len(slack.posts_for(rid)) == 1
    assert len(discord.calls_to("create")) == 1


def test_a_vote_on_telegram_shows_on_the_discord_card_and_the_second_persons_vote_decides(
    redis: Redis, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    config = parse_config(
        {
            "queues": {"default": {"channels": ["telegram:ops", "discord:ops"], "quorum": 2}},
            "telegram": telegram_section(telegram),
            "discord": discord_section(discord),
            "approvers": people(),
        }
    )
    broker = Broker(redis, config, prefix="t:")
    with running(broker), TestClient(create_app(Settings(), config, broker)) as client:
        rid = broker.create_request(NewRequest(tool_name="refund", args={"amount": 40})).id
        wait_for(lambda: telegram.cards_for(rid) and discord.cards_for(rid))
        approve = ids.token(ids.APPROVE, rid)
        [tg_card] = telegram.cards_for(rid)
        voted = tg_post(client, telegram.click(tg_card, ALICE_TG, approve)).json()
        assert voted["text"] == "Your vote is counted."
        wait_for(lambda: "1 of 2 approvals: alice" in discord.cards_for(rid)[0]["content"])
        [dc_card] = discord.cards_for(rid)
        assert approve in custom_ids(dc_card)  # still open for a second person
        dc_post(client, discord, discord.click(dc_card, ALICE_DC, approve))  # alice again
        assert broker.get_request(rid).is_pending
        dc_post(client, discord, discord.click(dc_card, BOB_DC, approve))
        assert broker.get_request(rid).status is Status.approved
        wait_for(lambda: "Approved by bob" in telegram.cards_for(rid)[0]["text"])
