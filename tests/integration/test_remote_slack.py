"""An agent outside the fleet asks over Slack: `BrokerApprovals` creates the request, the notifier
posts it to (a fake) Slack, a person clicks Approve (a signed interaction to the API), and the
agent's run goes on live with the approved tool."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from approval_broker_client import BrokerApprovals, RemoteBroker
from redis import Redis
from slack_sdk.signature import SignatureVerifier

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import parse_config
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.slack import action_ids as ids
from tests.support.auth import person
from tests.support.fakes.harness import running
from tests.support.fakes.slack import FakeSlack, request_id_of
from tests.support.remote_agents import make_agent
from tests.support.waiting import wait_for

SIGNING_SECRET = "remote-slack-signing-secret"


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    fake = FakeSlack().start()
    yield fake
    fake.stop()


@pytest.fixture
def slack_broker(redis: Redis, slack: FakeSlack) -> Broker:
    config = parse_config(
        {
            "queues": {"default": {"channels": ["slack:approvals"]}},
            "slack": {
                "bot_token": slack.token,
                "signing_secret": SIGNING_SECRET,
                "api_base_url": slack.url,
                "channels": {"approvals": {"channel": "C1"}},
            },
            "approvers": {
                "agent": person("tok-agent", ["requester"]),
                "alice": {"roles": ["finance"], "slack_user_id": "U0ALICE"},
            },
        }
    )
    return Broker(redis, config, prefix="t:")


def approve_click(request_id: str) -> tuple[bytes, dict[str, str]]:
    payload = {
        "type": "block_actions",
        "user": {"id": "U0ALICE", "username": "alice"},
        # the message's channel, as Slack sends it: a click counts only from a channel of the
        # queue the request waits in now (here slack:approvals, Slack channel C1)
        "channel": {"id": "C1", "name": "approvals"},
        "trigger_id": "trig-1",
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
    assert signature is not None
    return body, {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


def buttons(message: dict[str, Any]) -> list[str]:
    return [
        element["action_id"]
        for block in message.get("blocks", [])
        if block.get("type") == "actions"
        for element in block.get("elements", [])
    ]


def test_a_remote_agent_is_approved_from_slack_and_goes_on_live(
    slack_broker: Broker, slack: FakeSlack
) -> None:
    app = create_app(Settings(), slack_broker.config, slack_broker)
    clicked: list[tuple[int, Any]] = []

    def alice(url: str) -> None:
        [post] = wait_for(lambda: slack.calls_to("chat.postMessage", ok_only=True))
        request_id = request_id_of(post.params)
        assert request_id is not None
        message = wait_for(lambda: slack.message_for(request_id))
        assert ids.APPROVE in buttons(message)
        body, headers = approve_click(request_id)
        resp = httpx.post(f"{url}/v1/slack/interactions", content=body, headers=headers)
        clicked.append((resp.status_code, resp.json()))

    executed: list[Any] = []
    with (
        ServerThread(app) as server,
        running(slack_broker),
        RemoteBroker(server.url, "tok-agent") as client,
    ):
        person = threading.Thread(target=alice, args=(server.url,), daemon=True)
        person.start()
        agent = make_agent(BrokerApprovals(client, live_wait_s=30), executed)
        result = agent.run_sync("Refund $120 on A103")
        person.join(10)
        [request] = slack_broker.list_requests()
        wait_for(lambda: slack.calls_to("chat.update", ok_only=True))  # the message says so
    assert clicked == [(200, {"ok": True, "request_id": request.id, "status": "approved"})]
    assert result.output == "refund: refunded 120.0 on A103"
    assert executed == [("A103", 120.0)]
    assert request.status == "approved" and request.decision
    assert request.decision.decided_by == "alice"
    assert buttons(slack.message_for(request.id) or {}) == []
