"""Discord interactions under fuzz: hostile interactions signed with the fake application's
Ed25519 key (so they reach the interaction parser, the click and modal handlers and the judge),
hostile signature headers (a timestamp signed as given, a signature of any shape), and signed
bodies that are no interaction at all. Each gets no 5xx, a 4xx `{"error", "detail"}` or an
interaction response (JSON), and changes nothing in Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.cards import button_tokens as ids
from tests.support.chat_setup import (  # noqa: F401 - the fake's fixture
    ALICE_DC,
    BOB_DC,
    DC_CHANNEL,
    EVE_DC,
    discord_section,
    fake_discord,
    people,
)
from tests.support.fakes.discord import FakeDiscord
from tests.support.fuzzing import (
    FUZZ,
    assert_clean_answer,
    assert_unchanged,
    dumps,
    header_text,
    hostile_timestamps,
    json_values,
    mutated,
    snapshot,
    undecidable_requests,
)

VERBS = [ids.APPROVE, ids.REJECT, ids.ESCALATE, ids.ACK, ids.ALWAYS]


@pytest.fixture
def world(redis: Redis, discord: FakeDiscord) -> Iterator[tuple[Broker, TestClient, dict]]:
    config = parse_config(
        {
            "queues": {
                "default": {"channels": ["discord:ops"], "escalate_to": "leads"},
                "leads": {"channels": ["discord:ops"]},
                "held": {"channels": ["inbox"]},
            },
            "discord": discord_section(discord, ops=DC_CHANNEL),
            "approvers": people(),
        }
    )
    broker = Broker(redis, config, prefix="fz:")
    requests = undecidable_requests(broker, held="held", decided="default")
    with TestClient(create_app(Settings(), config, broker)) as client:
        yield broker, client, requests


def bases(app_id: str) -> list[dict[str, Any]]:
    """A PING, a click in a server and in a DM, and a reject modal's submission."""
    common = {"id": "{iid}", "application_id": app_id, "token": "t", "version": 1}
    member = {"member": {"user": {"id": "{user}", "username": "u"}, "roles": []}}
    message = {"id": "1100000000000000999", "channel_id": DC_CHANNEL}
    reason = {"type": 1, "components": [{"type": 4, "custom_id": "reason", "value": "wrong"}]}
    return [
        {**common, "type": 1},
        {
            **common,
            **member,
            "type": 3,
            "channel_id": DC_CHANNEL,
            "guild_id": "800000000000000001",
            "message": message,
            "data": {"custom_id": "{token}", "component_type": 2},
        },
        {
            **common,
            "type": 3,
            "channel_id": DC_CHANNEL,
            "user": {"id": "{user}"},
            "message": message,
            "data": {"custom_id": "{token}", "component_type": 2},
        },
        {
            **common,
            **member,
            "type": 5,
            "channel_id": DC_CHANNEL,
            "message": message,
            "data": {"custom_id": "{modal}", "components": [reason]},
        },
    ]


def tokens(requests: dict[str, str]) -> list[str]:
    out = [ids.token(verb, rid) for rid in requests.values() for verb in VERBS]
    out += [ids.token(ids.OPTION, rid, 0) for rid in requests.values()]
    out += [ids.token(ids.ALWAYS_RULE, rid, 0) for rid in requests.values()]
    return [*out, "a:req_gone", "x", ""]


def post(client: TestClient, body: bytes, headers: dict[str, str]) -> Any:
    return client.post("/v1/discord/interactions", content=body, headers=headers)


def signed(discord: FakeDiscord, body: bytes, stamp: str | None = None) -> dict[str, str]:
    """Discord's headers for `body`: the Ed25519 signature of the timestamp (as given) + body."""
    stamp = str(int(time.time())) if stamp is None else stamp
    signature = discord.key.sign(stamp.encode() + body).signature.hex()
    return {"X-Signature-Ed25519": signature, "X-Signature-Timestamp": stamp}


def test_signed_hostile_interactions_get_a_clean_answer_and_change_nothing(
    world: tuple[Broker, TestClient, dict], discord: FakeDiscord
) -> None:
    broker, client, requests = world
    before = snapshot(broker)
    fills = {
        "iid": st.integers(min_value=1, max_value=2**62).map(str),
        "user": [ALICE_DC, BOB_DC, EVE_DC],
        "token": tokens(requests),
        "modal": [ids.token(ids.REJECT, rid) for rid in requests.values()],  # what Reject opens
    }

    @FUZZ
    @given(interaction=mutated(bases(discord.application_id), fills))
    def run(interaction: Any) -> None:
        body = dumps(interaction)
        resp = post(client, body, signed(discord, body))
        assert_clean_answer(resp)
        assert_unchanged(broker, before, requests)

    run()


def test_hostile_signature_headers_are_refused_and_change_nothing(
    world: tuple[Broker, TestClient, dict], discord: FakeDiscord
) -> None:
    broker, client, requests = world
    before = snapshot(broker)
    click = bases(discord.application_id)[1]
    click = {**click, "id": "1", "member": {"user": {"id": ALICE_DC}}}
    body = dumps({**click, "data": {"custom_id": ids.token(ids.APPROVE, requests["held"])}})

    @FUZZ
    @given(stamp=hostile_timestamps, signature=st.none() | header_text)
    def run(stamp: str, signature: str | None) -> None:
        headers = signed(discord, body, stamp)
        if signature is not None:
            headers["X-Signature-Ed25519"] = signature
        resp = post(client, body, headers)
        assert_clean_answer(resp)
        assert resp.status_code == 401
        assert_unchanged(broker, before, requests)

    run()


def test_signed_bodies_that_are_no_interaction_get_a_4xx_and_change_nothing(
    world: tuple[Broker, TestClient, dict], discord: FakeDiscord
) -> None:
    broker, client, requests = world
    before = snapshot(broker)

    @FUZZ
    @given(body=st.binary(max_size=200) | json_values.map(dumps))
    def run(body: bytes) -> None:
        resp = post(client, body, signed(discord, body))
        assert_clean_answer(resp)
        assert_unchanged(broker, before, requests)

    run()
