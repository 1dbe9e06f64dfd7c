"""Telegram: the card a notifier posts through the fake Bot API, and the updates the bot's
webhook (`POST /v1/telegram/updates`) accepts, refuses or ignores; a real Redis throughout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Outcome, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.cards import button_tokens as ids
from tests.support.chat_setup import (  # noqa: F401 - fixtures
    ALICE_TG,
    BOB_TG,
    EVE_TG,
    TG_CHAT,
    TG_OTHER_CHAT,
    TG_SECRET,
    fake_telegram,
    people,
    telegram_section,
    tg_post,
)
from tests.support.fakes.harness import running
from tests.support.fakes.telegram import FakeTelegram, buttons
from tests.support.notifier_setup import settled
from tests.support.waiting import wait_for


def stat(broker: Broker, name: str) -> int:
    return int(broker.redis.hget(broker.keys.stats, name) or 0)


def config_for(telegram: FakeTelegram, **queue: Any) -> dict[str, Any]:
    return {
        "queues": {
            "default": {"channels": ["telegram:ops"], "escalate_to": "leads", **queue},
            "leads": {"channels": ["telegram:leads"]},
        },
        "telegram": telegram_section(telegram, ops=TG_CHAT, leads=TG_OTHER_CHAT),
        "approvers": people(),
    }


@pytest.fixture
def tg(redis: Redis, telegram: FakeTelegram) -> Iterator[tuple[Broker, TestClient]]:
    config = parse_config(config_for(telegram))
    broker = Broker(redis, config, prefix="t:")
    with TestClient(create_app(Settings(), config, broker)) as client:
        yield broker, client


def refund(**extra: Any) -> NewRequest:
    return NewRequest(tool_name="refund", args={"order": "A1", "amount": 40}, **extra)


def posted(
    broker: Broker, telegram: FakeTelegram, request: NewRequest
) -> tuple[str, dict[str, Any]]:
    """Create `request` with a notifier running and wait for its card."""
    with running(broker):
        created = broker.create_request(request)
        wait_for(lambda: telegram.cards_for(created.id))
        wait_for(lambda: settled(broker, created.queue))
    [card] = telegram.cards_for(created.id)
    return created.id, card


# ---- the card ----------------------------------------------------------------------------


def test_a_card_has_approve_reject_and_escalate_buttons_in_compact_tokens(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, _ = tg
    rid, card = posted(broker, telegram, refund(prompt="Refund\u202e order A1"))
    tokens = buttons(card)
    assert tokens == [
        ids.token(ids.APPROVE, rid),
        ids.token(ids.REJECT, rid),
        ids.token(ids.ACK, rid),
        ids.token(ids.ESCALATE, rid),
    ]
    assert all(len(t.encode()) <= 64 for t in tokens)
    assert "\u202e" not in card["text"] and "Refund order A1" in card["text"]
    [call] = telegram.calls_to("sendMessage")
    assert "parse_mode" not in call.params  # plain text: requester text formats nothing
    assert stat(broker, "delivered:telegram") == 1


def test_a_question_with_options_gets_one_answer_button_per_option(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, client = tg
    ask = NewRequest(
        tool_name="pick", kind="question", prompt="Which size?", metadata={"options": ["S", "M"]}
    )
    rid, card = posted(broker, telegram, ask)
    assert buttons(card)[:2] == [ids.token(ids.OPTION, rid, 0), ids.token(ids.OPTION, rid, 1)]
    resp = tg_post(client, telegram.click(card, BOB_TG, ids.token(ids.OPTION, rid, 1)))
    assert resp.json()["text"] == "Done: answered."
    decided = broker.get_request(rid)
    assert decided.status is Status.answered and decided.decision.answer == "M"  # type: ignore[union-attr]


# ---- clicks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "secret", [None, "wrong-secret-0123456789", "telegram-webhook-secret-012345678"]
)
def test_an_update_without_the_right_secret_token_is_refused_and_decides_nothing(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram, secret: str | None
) -> None:
    broker, client = tg
    rid = broker.create_request(refund()).id
    card = {"message_id": 1, "chat": {"id": TG_CHAT}}
    resp = tg_post(client, telegram.click(card, ALICE_TG, ids.token(ids.APPROVE, rid)), secret)
    assert resp.status_code == 401 and resp.json()["error"] == "bad_secret"
    assert broker.get_request(rid).is_pending


def test_a_user_who_is_no_approver_is_refused(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, client = tg
    rid = broker.create_request(refund()).id
    card = {"message_id": 1, "chat": {"id": TG_CHAT}}
    resp = tg_post(client, telegram.click(card, EVE_TG, ids.token(ids.APPROVE, rid)))
    body = resp.json()
    assert body["method"] == "answerCallbackQuery" and body["show_alert"] is True
    assert f"Telegram user {EVE_TG} is not an approver" in body["text"]
    assert broker.get_request(rid).is_pending


def test_a_click_from_a_chat_the_queue_does_not_list_decides_nothing(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, client = tg
    rid = broker.create_request(refund()).id
    card = {"message_id": 1, "chat": {"id": TG_OTHER_CHAT}}  # telegram:leads serves `leads`
    resp = tg_post(client, telegram.click(card, ALICE_TG, ids.token(ids.APPROVE, rid)))
    assert resp.json()["text"] == "You may not decide this request from here."
    assert broker.get_request(rid).is_pending


def test_the_one_who_asked_may_not_approve_by_telegram(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, client = tg
    rid = broker.create_request(refund(created_by="alice")).id
    card = {"message_id": 1, "chat": {"id": TG_CHAT}}
    resp = tg_post(client, telegram.click(card, ALICE_TG, ids.token(ids.APPROVE, rid)))
    assert "may not approve it" in resp.json()["text"]
    assert broker.get_request(rid).is_pending


def test_a_click_on_a_decided_request_names_who_decided_and_changes_nothing(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, client = tg
    rid = broker.create_request(refund()).id
    broker.decide(rid, Decision(outcome=Outcome.rejected, reason="no"), decided_by="bob")
    card = {"message_id": 1, "chat": {"id": TG_CHAT}}
    resp = tg_post(client, telegram.click(card, ALICE_TG, ids.token(ids.APPROVE, rid)))
    assert resp.json()["text"] == "Too late: this request was already rejected by bob."
    after = broker.get_request(rid)
    assert after.status is Status.rejected and after.decision.decided_by == "bob"  # type: ignore[union-attr]


def test_a_redelivered_update_is_handled_once(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, client = tg
    rid = broker.create_request(refund()).id
    card = {"message_id": 1, "chat": {"id": TG_CHAT}}
    update = telegram.click(card, ALICE_TG, ids.token(ids.APPROVE, rid))
    assert tg_post(client, update).json()["text"] == "Done: approved."
    first = broker.get_request(rid).decision
    assert tg_post(client, update).json() == {}  # seen: not handled again, not even answered
    assert broker.get_request(rid).decision == first


def test_reject_asks_for_a_reason_by_force_reply_and_the_reply_completes_it(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, client = tg
    rid, card = posted(broker, telegram, refund())
    resp = tg_post(client, telegram.click(card, ALICE_TG, ids.token(ids.REJECT, rid)))
    assert resp.json()["text"] == "Reply to my message with the reason."
    assert broker.get_request(rid).is_pending
    prompt_call = telegram.calls_to("sendMessage", ok_only=True)[-1]
    assert prompt_call.params["reply_markup"]["force_reply"] is True
    prompt = prompt_call.response["result"]
    # someone else's reply is not the reason
    other = tg_post(client, telegram.reply(prompt, BOB_TG, "fine by me"))
    assert "Only the one who clicked Reject" in other.json()["text"]
    assert broker.get_request(rid).is_pending
    done = tg_post(client, telegram.reply(prompt, ALICE_TG, "wrong order\u202e number"))
    assert done.json()["text"] == "Rejected."
    decided = broker.get_request(rid)
    assert decided.status is Status.rejected
    assert decided.decision is not None and decided.decision.decided_by == "alice"
    assert decided.decision.reason == "wrong order\u202e number"
    with running(broker):  # the card follows, reason shown without the bidi override
        wait_for(lambda: "Rejected by alice" in telegram.cards_for(rid)[0]["text"])
    text = telegram.cards_for(rid)[0]["text"]
    assert "Reason: wrong order number" in text and not buttons(telegram.cards_for(rid)[0])


def test_one_person_votes_once_whatever_the_channel(redis: Redis, telegram: FakeTelegram) -> None:
    config = parse_config(config_for(telegram, quorum=2))
    broker = Broker(redis, config, prefix="t:")
    rid = broker.create_request(refund()).id
    card = {"message_id": 1, "chat": {"id": TG_CHAT}}
    with TestClient(create_app(Settings(), config, broker)) as client:
        from broker.domain.principals import Principal
        from broker.judge import Judge

        Judge(broker).decide(  # alice by her bearer token first (the inbox)
            rid,
            Decision(outcome=Outcome.approved),
            Principal("alice", frozenset({"finance"})),
            via=["inbox", "telegram:ops"],
        )
        again = tg_post(client, telegram.click(card, ALICE_TG, ids.token(ids.APPROVE, rid)))
        assert broker.get_request(rid).is_pending  # alice by Telegram is still alice
        assert again.json()["show_alert"] is False
        tg_post(client, telegram.click(card, BOB_TG, ids.token(ids.APPROVE, rid)))
    decided = broker.get_request(rid)
    assert decided.status is Status.approved
    assert sorted(v.by for v in decided.approvals) == ["alice", "bob"]


# ---- the platform failing ----------------------------------------------------------------


def test_a_429_waits_for_the_bot_apis_retry_after_then_posts_once(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, _ = tg
    telegram.fail("sendMessage", 429, retry_after=1)
    with running(broker):
        rid = broker.create_request(refund()).id
        wait_for(lambda: telegram.cards_for(rid))
    limited, ok = telegram.calls_to("sendMessage")
    assert limited.status == 429 and ok.status == 200
    assert ok.at - limited.at >= 1.0
    assert stat(broker, "failed:telegram") == 1 and stat(broker, "delivered:telegram") == 1


def test_a_bot_api_that_stays_down_dead_letters_the_card_after_the_last_try(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, _ = tg
    for _ in range(3):
        telegram.fail("sendMessage", 502)
    with running(broker, max_attempts=3):
        rid = broker.create_request(refund()).id
        wait_for(lambda: broker.dead_letters())
    ((_, letter),) = broker.dead_letters()
    assert letter["source"] == "telegram:ops" and letter["f.request_id"] == rid
    assert "HTTP 502" in letter["error"]
    assert len(telegram.calls_to("sendMessage")) == 3 and not telegram.cards_for(rid)


def test_a_wrong_bot_token_is_given_up_at_once(redis: Redis, telegram: FakeTelegram) -> None:
    raw = config_for(telegram)
    raw["telegram"]["bot_token"] = "123:not-the-token"
    broker = Broker(redis, parse_config(raw), prefix="t:")
    started = time.monotonic()
    with running(broker):
        broker.create_request(refund())
        wait_for(lambda: broker.dead_letters())
    ((_, letter),) = broker.dead_letters()
    assert "HTTP 401" in letter["error"] and time.monotonic() - started < 10
    assert len(telegram.calls) == 1


def test_metrics_count_telegram_deliveries_and_decisions_by_channel(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, client = tg
    rid, card = posted(broker, telegram, refund())
    tg_post(client, telegram.click(card, ALICE_TG, ids.token(ids.APPROVE, rid)))
    samples = {
        (s.name, s.labels.get("channel")): s.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for s in family.samples
    }
    assert samples[("approval_broker_deliveries_total", "telegram")] == 1
    assert samples[("approval_broker_decision_latency_seconds_count", "telegram")] == 1


BIG = "9" * 400
CLICK = (
    '{"update_id": %s, "callback_query": {"id": "%s", "from": {"id": %s},'
    ' "message": {"message_id": %s, "chat": {"id": %s}}, "data": "%s"}}'
)
REPLY = (
    '{"update_id": 7, "message": {"message_id": 8, "chat": {"id": %s}, "from": {"id": 1111},'
    ' "text": %s, "reply_to_message": %s}}'
)
MALFORMED_UPDATES = {
    "not-json": b"not json",
    "an-array": b"[1, 2]",
    "update-id-a-string": b'{"update_id": "x"}',
    "update-id-400-digits": (CLICK % (BIG, "cq", 1111, 1, TG_CHAT, "a:x")).encode(),
    "update-id-5000-digits": (CLICK % ("9" * 5000, "cq", 1111, 1, TG_CHAT, "a:x")).encode(),
    "update-id-a-float": (CLICK % ("1.5", "cq", 1111, 1, TG_CHAT, "a:x")).encode(),
    "user-id-400-digits": (CLICK % (7, "cq", BIG, 1, TG_CHAT, "a:x")).encode(),
    "chat-id-400-digits": (CLICK % (7, "cq", 1111, 1, BIG, "a:x")).encode(),
    "message-id-400-digits": (CLICK % (7, "cq", 1111, BIG, TG_CHAT, "a:x")).encode(),
    "query-id-10000-characters": (CLICK % (7, "q" * 10_000, 1111, 1, TG_CHAT, "a:x")).encode(),
    "data-10000-characters": (CLICK % (7, "cq", 1111, 1, TG_CHAT, "a" * 10_000)).encode(),
    "callback-query-a-list": b'{"update_id": 7, "callback_query": []}',
    "chat-a-string": b'{"update_id": 7, "message": {"message_id": 1, "chat": "ops"}}',
    "text-a-number": (REPLY % (TG_CHAT, 5, '{"message_id": 1}')).encode(),
    "text-past-telegrams-4096": (REPLY % (TG_CHAT, '"' + "x" * 5000 + '"', "null")).encode(),
    "reply-to-a-number": (REPLY % (TG_CHAT, '"no"', "5")).encode(),
    "nested-3000-deep": b'{"update_id": 7, "x": ' + b"[" * 3000 + b"]" * 3000 + b"}",
}


@pytest.mark.parametrize("body", list(MALFORMED_UPDATES.values()), ids=list(MALFORMED_UPDATES))
def test_a_malformed_update_is_a_clear_400(tg: tuple[Broker, TestClient], body: bytes) -> None:
    broker, client = tg
    rid = broker.create_request(refund()).id
    headers = {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET, "Content-Type": "application/json"}
    resp = client.post(
        "/v1/telegram/updates", content=body.replace(b"a:x", rid.encode()), headers=headers
    )
    assert resp.status_code == 400 and set(resp.json()) == {"error", "detail"}
    assert resp.json()["error"] == "bad_request"
    assert broker.get_request(rid).is_pending


def test_a_timed_out_request_shows_so_on_its_card(
    tg: tuple[Broker, TestClient], telegram: FakeTelegram
) -> None:
    broker, _ = tg
    rid, _card = posted(broker, telegram, refund(queue="leads"))
    broker.sweep(now=time.time() + 7200)
    assert broker.get_request(rid).status is Status.timed_out
    with running(broker):
        wait_for(lambda: "Timed out" in telegram.cards_for(rid)[0]["text"])
    assert buttons(telegram.cards_for(rid)[0]) == []
