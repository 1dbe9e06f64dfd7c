"""Every JSON document from outside is parsed within a depth (64) and a size: a clear 4xx.

A signed Slack payload nested 5,000 deep used to raise `RecursionError` (a 500). Slack
payloads, REST bodies and webhook replies are now refused with a 4xx naming the bound, and
`broker.domain.bounded_json` (the one helper they share) is checked directly.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from slack_sdk.signature import SignatureVerifier
from standardwebhooks.webhooks import Webhook

from api.app import create_app
from broker.domain import bounded_json
from broker.domain.config import Config
from broker.domain.errors import InvalidInput
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
HOOK_SECRET = "whsec_" + base64.b64encode(b"secret-for-the-ops-endpoint-0123").decode()
AGENT = {"Authorization": "Bearer tok-agent"}


API_CONFIG = {
    "queues": {"default": {"channels": ["slack:approvals", "webhook:ops", "inbox"]}},
    "slack": {
        "bot_token": "xoxb-test",
        "signing_secret": SIGNING_SECRET,
        "api_base_url": "http://127.0.0.1:9/api",
        "channels": {"approvals": {"channel": "C1"}},
    },
    "webhooks": {"ops": {"url": "http://127.0.0.1:9/ops", "secret": HOOK_SECRET}},
    "approvers": {
        "agent": person("tok-agent", ["requester"]),
        "alice": {"roles": ["finance"], "slack_user_id": "U_ALICE"},
    },
}


@pytest.fixture
def broker(redis: Redis, cfg: Config) -> Broker:
    return Broker(redis, cfg, prefix="t:")


@pytest.fixture
def client(broker: Broker, cfg: Config) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(), cfg, broker), raise_server_exceptions=False) as c:
        yield c


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def slack_signed(payload_text: str) -> tuple[bytes, dict[str, str]]:
    body = urlencode({"payload": payload_text}).encode()
    ts = str(int(time.time()))
    signature = SignatureVerifier(SIGNING_SECRET).generate_signature(timestamp=ts, body=body)
    assert signature is not None
    return body, {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


@pytest.mark.parametrize("depth", [65, 5000, 100_000])
def test_a_signed_slack_payload_nested_deep_is_a_400(client: TestClient, depth: int) -> None:
    text = '{"type": "block_actions", "user": {"id": "U_ALICE"}, "actions": [], "x": '
    body, headers = slack_signed(text + nested(depth) + "}")
    response = client.post("/v1/slack/interactions", content=body, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json() == {
        "error": "bad_request",
        "detail": "payload: nested more than 64 deep",
    }


@pytest.mark.parametrize("depth", [70, 200])
def test_a_rest_body_nested_past_the_bound_is_a_422(client: TestClient, depth: int) -> None:
    body = '{"tool_name": "x", "args": {"a": ' + nested(depth) + "}}"
    response = client.post(
        "/v1/requests", content=body, headers={**AGENT, "content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert "nested more than 64 deep" in response.json()["detail"]
    assert len(response.json()["detail"]) < 300


def test_a_rest_body_within_the_bound_is_taken(client: TestClient) -> None:
    body = '{"tool_name": "x", "args": {"a": ' + nested(50) + "}}"
    response = client.post(
        "/v1/requests", content=body, headers={**AGENT, "content-type": "application/json"}
    )
    assert response.status_code == 201, response.text


def test_a_signed_webhook_reply_nested_deep_is_a_4xx(client: TestClient, broker: Broker) -> None:
    request = broker.create_request(NewRequest(tool_name="restart"))
    for depth in (70, 5000):
        raw = (
            '{"request_id": "'
            + request.id
            + '", "outcome": "approved", "metadata": {"a": '
            + nested(depth)
            + "}}"
        ).encode()
        when = datetime.now(UTC)
        msg_id = f"msg_deep_{depth}"
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": Webhook(HOOK_SECRET).sign(msg_id, when, raw.decode()),
            "content-type": "application/json",
        }
        response = client.post("/v1/webhooks/ops/replies", content=raw, headers=headers)
        assert response.status_code == 422, response.text
        assert "nested" in response.json()["detail"]
    assert broker.get_request(request.id).is_pending


# ---- the helper ------------------------------------------------------------------------------


def test_loads_refuses_deep_large_and_non_json_text_and_keeps_the_rest() -> None:
    assert bounded_json.loads(nested(64), "x") is not None
    for text in (nested(65), nested(5000), '{"a":' * 70_000):
        with pytest.raises(bounded_json.TooDeep, match="x: nested more than 64 deep"):
            bounded_json.loads(text, "x")
    with pytest.raises(bounded_json.TooLarge, match="at most 10"):
        bounded_json.loads("[" + "1," * 10 + "1]", "x", max_bytes=10)
    for text in ("[NaN]", "[Infinity]", "{", "\xff", ""):
        with pytest.raises(InvalidInput) as err:
            bounded_json.loads(text, "x")
        assert err.value.code == "invalid_json"
    # brackets and escaped quotes inside strings don't count as depth
    text = json.dumps({"s": "[[[[" * 100 + '\\"' + "{{{" * 100, "t": ["\\"]})
    assert bounded_json.loads(text, "x")["t"] == ["\\"]
    assert bounded_json.loads("[123456789012345678901234567890]", "x") == [
        123456789012345678901234567890
    ]


def test_depth_of_counts_without_recursion() -> None:
    value: Any = 1
    for _ in range(100_000):
        value = [value]
    assert bounded_json.depth_of(value) == 100_000
    assert bounded_json.depth_of(value, limit=64) == 65
    assert bounded_json.depth_of({"a": [1, {"b": []}], "c": 2}) == 4
    assert bounded_json.depth_of("text") == 0
