"""Slack interactions under fuzz: hostile payloads Slack's signature covers (signed with the
test secret, so they reach the payload parsers, the click and modal handlers and the judge),
hostile signature headers, and signed bodies that are no form at all. Each gets no 5xx, a 4xx
`{"error", "detail"}` or Slack's own answer shape (JSON), and changes nothing in Redis.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from redis import Redis

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.slack import action_ids as ids
from channels.slack import always_modal as always
from channels.slack.question_modal import ANSWER_FORM, ANSWER_FORM_CALLBACK
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
from tests.support.slack_api import SIGNING_SECRET, FakeSlack

ACTIONS = [
    ids.APPROVE,
    ids.REJECT,
    ids.ESCALATE,
    ids.ACK,
    ids.ANSWER,
    ids.option_action_id("S"),
    ids.ANSWER_TEXT,
    ANSWER_FORM,
    always.ALWAYS,
]


@pytest.fixture
def world(redis: Redis, fake_slack: FakeSlack) -> Iterator[tuple[Broker, TestClient, dict]]:
    config = parse_config(
        {
            "queues": {
                "default": {"channels": ["slack:approvals"], "escalate_to": "managers"},
                "managers": {"channels": ["slack:approvals"]},
                "held": {"channels": ["inbox"]},
            },
            "slack": {
                "bot_token": "xoxb-test",
                "signing_secret": SIGNING_SECRET,
                "api_base_url": f"{fake_slack.url}/api",
                "channels": {"approvals": {"channel": "C1"}},
            },
            "approvers": {
                "alice": {"roles": ["finance"], "slack_user_id": "U_ALICE"},
                "bob": {"roles": ["ops"], "slack_user_id": "U_BOB"},
            },
        }
    )
    broker = Broker(redis, config, prefix="fz:")
    requests = undecidable_requests(broker, held="held", decided="default")
    with TestClient(create_app(Settings(), config, broker)) as client:
        yield broker, client, requests


def bases() -> list[dict[str, Any]]:
    """Valid interactions naming `{rid}`: each button, and each modal's submission."""
    out: list[dict[str, Any]] = []
    typed = {"values": {ids.ANSWER_BLOCK: {ids.ANSWER_TEXT: {"value": "42"}}}}
    for action in ACTIONS:
        out.append(
            {
                "type": "block_actions",
                "user": {"id": "{user}"},
                "channel": {"id": "C1"},
                "trigger_id": "trig-1",
                "response_url": "{response_url}",
                "state": typed,
                "actions": [{"action_id": action, "value": "{rid}", "type": "button"}],
            }
        )
    reason = {ids.REJECT_REASON_BLOCK: {ids.REJECT_REASON_ACTION: {"value": "no"}}}
    rules = {
        always.RULE_BLOCK: {always.RULE_ACTION: {"selected_option": {"value": "0"}}},
        always.OUTCOME_BLOCK: {always.OUTCOME_ACTION: {"selected_option": {"value": "x"}}},
        always.REASON_BLOCK: {always.REASON_ACTION: {"value": "why"}},
    }
    form = {"q0": {"choice": {"selected_option": {"value": "0"}}}}
    for callback, values in [
        (ids.REJECT_CALLBACK, reason),
        (always.ALWAYS_CALLBACK, rules),
        (ANSWER_FORM_CALLBACK, form),
    ]:
        out.append(
            {
                "type": "view_submission",
                "user": {"id": "{user}"},
                "view": {
                    "callback_id": callback,
                    "private_metadata": "{rid} C1",
                    "state": {"values": values},
                },
            }
        )
    return out


def fills(requests: dict[str, str], fake_slack_url: str) -> dict[str, list[Any]]:
    return {
        "rid": [*requests.values(), "req_gone"],
        "user": ["U_ALICE", "U_BOB", "U_EVE"],
        "response_url": [None, f"{fake_slack_url}/actions/T1/1/x"],  # a refusal is posted there
    }


def signed_body(body: bytes, stamp: str | None = None) -> dict[str, str]:
    """Slack's v0 headers for `body` (any bytes: slack_sdk signs only text, Slack signs bytes)."""
    stamp = str(int(time.time())) if stamp is None else stamp
    base = f"v0:{stamp}:".encode() + body
    signature = "v0=" + hmac.new(SIGNING_SECRET.encode(), base, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


def form(payload: Any) -> bytes:
    return urlencode({"payload": dumps(payload).decode()}).encode()


def test_signed_hostile_interactions_get_a_clean_answer_and_change_nothing(
    world: tuple[Broker, TestClient, dict], fake_slack: FakeSlack
) -> None:
    broker, client, requests = world
    before = snapshot(broker)

    @FUZZ
    @given(payload=mutated(bases(), fills(requests, fake_slack.url)))
    def run(payload: Any) -> None:
        body = form(payload)
        resp = client.post("/v1/slack/interactions", content=body, headers=signed_body(body))
        assert_clean_answer(resp)
        assert_unchanged(broker, before, requests)

    run()


def test_hostile_signature_headers_are_refused_and_change_nothing(
    world: tuple[Broker, TestClient, dict],
) -> None:
    """Timestamps no clock gives (signed over as given, so only the timestamp is wrong) and
    signatures of any shape: 401 before the payload is read."""
    broker, client, requests = world
    before = snapshot(broker)
    click = {**bases()[0], "user": {"id": "U_ALICE"}, "response_url": None}
    body = form({**click, "actions": [{"action_id": ids.APPROVE, "value": requests["held"]}]})

    @FUZZ
    @given(stamp=hostile_timestamps, signature=st.none() | header_text)
    def run(stamp: str, signature: str | None) -> None:
        headers = signed_body(body, stamp)
        if signature is not None:
            headers["X-Slack-Signature"] = signature
        resp = client.post("/v1/slack/interactions", content=body, headers=headers)
        assert_clean_answer(resp)
        assert resp.status_code == 401
        assert_unchanged(broker, before, requests)

    run()


def test_signed_bodies_that_are_no_interaction_form_get_a_4xx_and_change_nothing(
    world: tuple[Broker, TestClient, dict],
) -> None:
    broker, client, requests = world
    before = snapshot(broker)
    bodies = st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: urlencode({"payload": dumps(v).decode()}).encode()),
        json_values.map(lambda v: dumps(v)),
        st.text(max_size=100).map(lambda t: ("payload=" + t).encode("utf-8", "surrogatepass")),
    )

    @FUZZ
    @given(body=bodies)
    def run(body: bytes) -> None:
        resp = client.post("/v1/slack/interactions", content=body, headers=signed_body(body))
        assert_clean_answer(resp)
        assert_unchanged(broker, before, requests)

    run()
