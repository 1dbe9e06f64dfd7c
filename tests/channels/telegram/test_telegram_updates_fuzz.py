"""Telegram updates under fuzz: hostile updates sent with the webhook's secret token (so they
reach the update parser, the click handler, the reason-reply handler and the judge), hostile
secret tokens, and bodies that are no update at all. Each gets no 5xx, a 4xx
`{"error", "detail"}` or a Bot API answer (JSON), and changes nothing in Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Outcome
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.cards import button_tokens as ids
from tests.support.chat_setup import (  # noqa: F401 - the fake's fixture
    ALICE_TG,
    BOB_TG,
    EVE_TG,
    TG_CHAT,
    TG_SECRET,
    fake_telegram,
    people,
    telegram_section,
    tg_post,
)
from tests.support.fakes.telegram import FakeTelegram
from tests.support.fuzzing import (
    FUZZ,
    assert_clean_answer,
    assert_unchanged,
    dumps,
    header_text,
    json_values,
    mutated,
    snapshot,
    undecidable_requests,
)

VERBS = [ids.APPROVE, ids.REJECT, ids.ESCALATE, ids.ACK, ids.ALWAYS]


@pytest.fixture
def world(
    redis: Redis, telegram: FakeTelegram
) -> Iterator[tuple[Broker, TestClient, dict[str, str], int]]:
    """The undecidable requests, and a Reject prompt left open for a request decided since
    (a reply to it reaches the judge, which refuses it: too late)."""
    config = parse_config(
        {
            "queues": {
                "default": {"channels": ["telegram:ops"], "escalate_to": "leads"},
                "leads": {"channels": ["telegram:ops"]},
                "held": {"channels": ["inbox"]},
            },
            "telegram": telegram_section(telegram, ops=TG_CHAT),
            "approvers": people(),
        }
    )
    broker = Broker(redis, config, prefix="fz:")
    requests = undecidable_requests(broker, held="held", decided="default")
    with TestClient(create_app(Settings(), config, broker)) as client:
        asked = broker.create_request(NewRequest(tool_name="refund", args={"amount": 7}))
        card = {"message_id": 1, "chat": {"id": TG_CHAT}}
        click = telegram.click(card, ALICE_TG, ids.token(ids.REJECT, asked.id))
        assert tg_post(client, click).json()["text"] == "Reply to my message with the reason."
        prompt = telegram.calls_to("sendMessage", ok_only=True)[-1].response["result"]
        broker.decide(asked.id, Decision(outcome=Outcome.approved), decided_by="bob")
        requests["asked"] = asked.id
        yield broker, client, requests, prompt["message_id"]


def tokens(requests: dict[str, str]) -> list[str]:
    out = [ids.token(verb, rid) for rid in requests.values() for verb in VERBS]
    out += [ids.token(ids.OPTION, rid, 0) for rid in requests.values()]
    out += [ids.token(ids.ALWAYS_RULE, rid, 0) for rid in requests.values()]
    return [*out, "a:req_gone", "x", ""]


BASES: list[dict[str, Any]] = [
    {
        "update_id": "{uid}",
        "callback_query": {
            "id": "cq1",
            "from": {"id": "{user}", "is_bot": False, "first_name": "U"},
            "message": {"message_id": 1, "chat": {"id": TG_CHAT, "type": "group"}},
            "chat_instance": "1",
            "data": "{token}",
        },
    },
    {
        "update_id": "{uid}",
        "message": {
            "message_id": 99,
            "from": {"id": "{user}", "is_bot": False, "first_name": "U"},
            "chat": {"id": TG_CHAT, "type": "group"},
            "date": 1_700_000_000,
            "text": "wrong order",
            "reply_to_message": {"message_id": "{prompt}", "chat": {"id": TG_CHAT}},
        },
    },
]


def post(client: TestClient, body: bytes, secret: str | None = TG_SECRET) -> Any:
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret
    return client.post("/v1/telegram/updates", content=body, headers=headers)


def test_hostile_updates_with_the_secret_get_a_clean_answer_and_change_nothing(
    world: tuple[Broker, TestClient, dict[str, str], int],
) -> None:
    broker, client, requests, prompt = world
    before = snapshot(broker)
    fills = {
        "uid": st.integers(min_value=1, max_value=2**53),
        "user": [ALICE_TG, BOB_TG, EVE_TG],
        "token": tokens(requests),
        "prompt": [prompt, 1],
    }

    @FUZZ
    @given(update=mutated(BASES, fills))
    def run(update: Any) -> None:
        resp = post(client, dumps(update))
        assert_clean_answer(resp)
        assert_unchanged(broker, before, requests)

    run()


def test_a_wrong_secret_token_is_refused_and_changes_nothing(
    world: tuple[Broker, TestClient, dict[str, str], int],
) -> None:
    broker, client, requests, _ = world
    before = snapshot(broker)
    update = {**BASES[0], "update_id": 1}
    update["callback_query"] = {
        **BASES[0]["callback_query"],
        "from": {"id": ALICE_TG},
        "data": ids.token(ids.APPROVE, requests["held"]),
    }

    @FUZZ
    @given(secret=st.none() | header_text.filter(lambda s: s != TG_SECRET))
    def run(secret: str | None) -> None:
        resp = post(client, dumps(update), secret)
        assert_clean_answer(resp)
        assert resp.status_code == 401
        assert_unchanged(broker, before, requests)

    run()


def test_bodies_that_are_no_update_get_a_4xx_or_nothing_done(
    world: tuple[Broker, TestClient, dict[str, str], int],
) -> None:
    broker, client, requests, _ = world
    before = snapshot(broker)

    @FUZZ
    @given(body=st.binary(max_size=200) | json_values.map(dumps))
    def run(body: bytes) -> None:
        resp = post(client, body)
        assert_clean_answer(resp)
        assert_unchanged(broker, before, requests)

    run()
