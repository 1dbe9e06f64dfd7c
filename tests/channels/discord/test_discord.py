"""Discord: the card a notifier posts through the fake REST API, and the interactions
`POST /v1/discord/interactions` verifies (Ed25519 with the fake's test key), answers, refuses
or opens a modal for; a real Redis throughout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from nacl.signing import SigningKey
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Outcome, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.cards import button_tokens as ids
from tests.support.chat_setup import (  # noqa: F401 - fixtures
    ALICE_DC,
    BOB_DC,
    DC_CHANNEL,
    DC_OTHER_CHANNEL,
    EVE_DC,
    dc_post,
    discord_section,
    fake_discord,
    people,
)
from tests.support.fakes.discord import FakeDiscord, custom_ids
from tests.support.fakes.harness import running
from tests.support.notifier_setup import settled
from tests.support.waiting import wait_for


def stat(broker: Broker, name: str) -> int:
    return int(broker.redis.hget(broker.keys.stats, name) or 0)


def config_for(discord: FakeDiscord, **queue: Any) -> dict[str, Any]:
    return {
        "queues": {
            "default": {"channels": ["discord:ops"], "escalate_to": "leads", **queue},
            "leads": {"channels": ["discord:leads"]},
        },
        "discord": discord_section(discord, ops=DC_CHANNEL, leads=DC_OTHER_CHANNEL),
        "approvers": people(),
    }


@pytest.fixture
def dc(redis: Redis, discord: FakeDiscord) -> Iterator[tuple[Broker, TestClient]]:
    config = parse_config(config_for(discord))
    broker = Broker(redis, config, prefix="t:")
    with TestClient(create_app(Settings(), config, broker)) as client:
        yield broker, client


def refund(**extra: Any) -> NewRequest:
    return NewRequest(tool_name="refund", args={"order": "A1", "amount": 40}, **extra)


def card_in(channel: str = DC_CHANNEL) -> dict[str, Any]:
    return {"id": "1100000000000000999", "channel_id": channel}


def posted(broker: Broker, discord: FakeDiscord, request: NewRequest) -> tuple[str, dict[str, Any]]:
    with running(broker):
        created = broker.create_request(request)
        wait_for(lambda: discord.cards_for(created.id))
        wait_for(lambda: settled(broker))
    [card] = discord.cards_for(created.id)
    return created.id, card


# ---- the card ----------------------------------------------------------------------------


def test_a_card_is_a_message_with_buttons_that_pings_no_one(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, _ = dc
    rid, card = posted(broker, discord, refund(prompt="@everyone refund **now**\u202e"))
    assert custom_ids(card) == [
        ids.token(ids.APPROVE, rid),
        ids.token(ids.REJECT, rid),
        ids.token(ids.ACK, rid),
        ids.token(ids.ESCALATE, rid),
    ]
    assert card["allowed_mentions"] == {"parse": []}
    assert "\\@everyone refund \\*\\*now\\*\\*" in card["content"]
    assert "\u202e" not in card["content"]
    assert stat(broker, "delivered:discord") == 1


# ---- interactions --------------------------------------------------------------------------


def test_a_ping_is_answered_with_a_pong(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    _, client = dc
    resp = dc_post(
        client, discord, {"id": "1", "type": 1, "application_id": discord.application_id}
    )
    assert resp.status_code == 200 and resp.json() == {"type": 1}


@pytest.mark.parametrize(
    "sign",
    [
        {"key": SigningKey.generate()},  # someone else's key
        {"skew_s": -600},  # stale
        {"skew_s": 600},  # from the future
    ],
    ids=["wrong-key", "stale", "future"],
)
def test_a_forged_or_stale_interaction_is_refused_and_decides_nothing(
    dc: tuple[Broker, TestClient], discord: FakeDiscord, sign: dict[str, Any]
) -> None:
    broker, client = dc
    if "skew_s" in sign:  # the time of the test, not of its collection
        sign = {"timestamp": int(time.time()) + sign["skew_s"]}
    rid = broker.create_request(refund()).id
    resp = dc_post(
        client, discord, discord.click(card_in(), ALICE_DC, ids.token(ids.APPROVE, rid)), **sign
    )
    assert resp.status_code == 401 and resp.json()["error"] in ("bad_signature", "stale")
    assert broker.get_request(rid).is_pending


def test_an_unsigned_interaction_is_refused(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    _, client = dc
    resp = client.post("/v1/discord/interactions", json={"type": 1})
    assert resp.status_code == 401 and resp.json()["error"] == "bad_signature"


def test_a_click_decides_and_defers_the_update_to_the_notifier(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, client = dc
    rid, card = posted(broker, discord, refund())
    resp = dc_post(client, discord, discord.click(card, BOB_DC, ids.token(ids.APPROVE, rid)))
    assert resp.json() == {"type": 6}
    assert broker.get_request(rid).status is Status.approved
    with running(broker):
        wait_for(lambda: "Approved by bob" in discord.cards_for(rid)[0]["content"])
    assert custom_ids(discord.cards_for(rid)[0]) == []
    [edit] = discord.calls_to("edit", ok_only=True)
    assert edit.message == card["id"]


def test_a_replayed_interaction_is_refused(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, client = dc
    rid = broker.create_request(refund()).id
    click = discord.click(card_in(), ALICE_DC, ids.token(ids.ACK, rid))
    assert dc_post(client, discord, click).status_code == 200
    again = dc_post(client, discord, click)
    assert again.status_code == 409 and again.json()["error"] == "replayed"


def test_a_user_who_is_no_approver_hears_why_and_only_they_see_it(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, client = dc
    rid = broker.create_request(refund()).id
    resp = dc_post(client, discord, discord.click(card_in(), EVE_DC, ids.token(ids.APPROVE, rid)))
    body = resp.json()
    assert body["type"] == 4 and body["data"]["flags"] == 64
    assert f"Discord user {EVE_DC} is not an approver" in body["data"]["content"]
    assert broker.get_request(rid).is_pending


def test_a_click_from_a_channel_the_queue_does_not_list_decides_nothing(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, client = dc
    rid = broker.create_request(refund()).id
    click = discord.click(card_in(DC_OTHER_CHANNEL), ALICE_DC, ids.token(ids.APPROVE, rid))
    content = dc_post(client, discord, click).json()["data"]["content"]
    assert content == "You may not decide this request from here."
    assert broker.get_request(rid).is_pending


def test_a_click_on_a_decided_request_names_who_decided_and_changes_nothing(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, client = dc
    rid = broker.create_request(refund()).id
    broker.decide(rid, Decision(outcome=Outcome.approved), decided_by="bob")
    resp = dc_post(client, discord, discord.click(card_in(), ALICE_DC, ids.token(ids.REJECT, rid)))
    assert resp.json()["data"]["content"] == "Too late: this request was already approved by bob."
    assert broker.get_request(rid).status is Status.approved


def test_reject_opens_a_modal_and_its_submission_rejects_with_the_reason(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, client = dc
    rid = broker.create_request(refund()).id
    resp = dc_post(client, discord, discord.click(card_in(), ALICE_DC, ids.token(ids.REJECT, rid)))
    modal = resp.json()
    assert modal["type"] == 9 and modal["data"]["custom_id"] == ids.token(ids.REJECT, rid)
    [[reason_input]] = [row["components"] for row in modal["data"]["components"]]
    assert reason_input["type"] == 4 and reason_input["custom_id"] == "reason"
    assert broker.get_request(rid).is_pending
    submit = discord.submit(card_in(), ALICE_DC, modal["data"]["custom_id"], "wrong order")
    assert dc_post(client, discord, submit).json() == {"type": 6}
    decided = broker.get_request(rid)
    assert decided.status is Status.rejected
    assert decided.decision is not None and decided.decision.reason == "wrong order"
    assert decided.decision.decided_by == "alice"


def test_i_am_on_it_acks_and_the_card_says_so(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, client = dc
    rid, card = posted(broker, discord, refund())
    resp = dc_post(client, discord, discord.click(card, ALICE_DC, ids.token(ids.ACK, rid)))
    assert "You're on it" in resp.json()["data"]["content"]
    assert broker.get_request(rid).acked_by == "alice"
    with running(broker):
        wait_for(lambda: "alice is on it" in discord.cards_for(rid)[0]["content"])


# ---- the platform failing ----------------------------------------------------------------


def test_a_429_waits_for_discords_retry_after_then_posts_once(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, _ = dc
    discord.fail("create", 429, retry_after=1.0)
    with running(broker):
        rid = broker.create_request(refund()).id
        wait_for(lambda: discord.cards_for(rid))
    limited, ok = discord.calls_to("create")
    assert limited.status == 429 and ok.status == 200
    assert ok.at - limited.at >= 1.0
    assert stat(broker, "failed:discord") == 1 and stat(broker, "delivered:discord") == 1


def test_an_edit_that_keeps_failing_is_dead_lettered_and_the_decision_stands(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    broker, _ = dc
    rid, _card = posted(broker, discord, refund())
    for _ in range(3):
        discord.fail("edit", 503)
    broker.decide(rid, Decision(outcome=Outcome.approved), decided_by="alice")
    with running(broker, max_attempts=3):
        wait_for(lambda: broker.dead_letters())
    ((_, letter),) = broker.dead_letters()
    assert letter["source"] == "discord:ops" and letter["f.type"] == "approval.decided"
    assert "HTTP 503" in letter["error"]
    assert broker.get_request(rid).status is Status.approved


def test_a_signed_body_that_is_not_an_interaction_is_a_clear_400(
    dc: tuple[Broker, TestClient], discord: FakeDiscord
) -> None:
    _, client = dc
    stamp = str(int(time.time()))
    body = b"not json"
    headers = {
        "X-Signature-Ed25519": discord.key.sign(stamp.encode() + body).signature.hex(),
        "X-Signature-Timestamp": stamp,
    }
    resp = client.post("/v1/discord/interactions", content=body, headers=headers)
    assert resp.status_code == 400 and resp.json()["error"] == "bad_request"


@pytest.mark.parametrize(
    "components",
    ["abc", 5, [[1]], [None], [{"components": "x"}], [{"components": [5]}], {"a": 1}],
    ids=[
        "a-string",
        "a-number",
        "a-list-in-a-list",
        "null-row",
        "row-a-string",
        "item-a-number",
        "an-object",
    ],
)
def test_a_signed_modal_submit_with_malformed_components_is_a_400_and_decides_nothing(
    dc: tuple[Broker, TestClient], discord: FakeDiscord, components: Any
) -> None:
    broker, client = dc
    rid = broker.create_request(refund()).id
    submit = discord.submit(card_in(), ALICE_DC, ids.token(ids.REJECT, rid), "wrong order")
    submit["data"]["components"] = components
    resp = dc_post(client, discord, submit)
    assert resp.status_code == 400 and set(resp.json()) == {"error", "detail"}
    assert broker.get_request(rid).is_pending


@pytest.mark.parametrize(
    "stamp",
    ["9" * 400, "-" + "9" * 400, "1" * 5000, "1.7e9", " 1700000000", ""],
    ids=["400-digits", "negative-400-digits", "5000-digits", "a-float", "a-space", "empty"],
)
def test_a_signed_interaction_with_a_malformed_timestamp_is_a_401(
    dc: tuple[Broker, TestClient], discord: FakeDiscord, stamp: str
) -> None:
    broker, client = dc
    rid = broker.create_request(refund()).id
    click = discord.click(card_in(), ALICE_DC, ids.token(ids.APPROVE, rid))
    resp = dc_post(client, discord, click, timestamp=stamp)
    assert resp.status_code == 401 and resp.json()["error"] in ("bad_signature", "stale")
    assert broker.get_request(rid).is_pending
