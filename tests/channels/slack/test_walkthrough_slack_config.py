"""The walkthrough's Slack config, as written, lets its approver decide the demo's requests: a
signed Approve click from the `slack_user_id` it names decides as "you" (role `approver`), and a
click from anyone else decides nothing. Slack's own servers are the one part not run here."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from slack_sdk.signature import SignatureVerifier

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.slack import action_ids as ids
from tests.support.docs_examples import blocks, page

SIGNING_SECRET = "walkthrough-signing-secret-0123456789"


@pytest.fixture
def cfg(monkeypatch: pytest.MonkeyPatch) -> Config:
    """The walkthrough's TOML block with the reader's secrets and token hash filled in."""
    [text] = [b for b in blocks(page("walkthrough.md"), "toml") if "[slack]" in b]
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-walkthrough")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SIGNING_SECRET)
    filled = text.replace('token_sha256 = "..."', f'token_sha256 = "{hash_token("ab_you-0123")}"')
    return parse_config(tomllib.loads(filled))


@pytest.fixture
def slack(api_broker: Broker, cfg: Config) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(), cfg, api_broker)) as client:
        yield client


def click(client: TestClient, request_id: str, user: str) -> dict:
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower()},
        "channel": {"id": "C0123456", "name": "approvals"},
        "trigger_id": f"trig-{time.monotonic_ns()}",
        "actions": [
            {
                "action_id": ids.APPROVE,
                "block_id": ids.actions_block_id(request_id),
                "value": request_id,
                "type": "button",
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()))
    signature = SignatureVerifier(SIGNING_SECRET).generate_signature(timestamp=ts, body=body)
    headers = {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": str(signature),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    answer = client.post("/v1/slack/interactions", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def demo_request(broker: Broker) -> str:
    """What the demo's A103 run asks for, on the walkthrough's queue `default`."""
    return broker.create_request(
        NewRequest(
            tool_name="issue_refund",
            args={"order_id": "A103", "amount": 120},
            prompt="Refund $120.00 on order A103?",
            agent="refunds",
        )
    ).id


def test_the_walkthrough_approver_decides_by_clicking_approve(
    slack: TestClient, api_broker: Broker
) -> None:
    request_id = demo_request(api_broker)
    click(slack, request_id, "U0123")
    decided = api_broker.get_request(request_id)
    assert decided.status.value == "approved"
    assert decided.decision is not None and decided.decision.decided_by == "you"


def test_a_click_from_a_slack_user_the_walkthrough_does_not_name_decides_nothing(
    slack: TestClient, api_broker: Broker
) -> None:
    request_id = demo_request(api_broker)
    click(slack, request_id, "U_SOMEONE_ELSE")
    assert api_broker.get_request(request_id).status.value == "pending"
