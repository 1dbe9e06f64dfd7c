"""The Slack API test setup: a config with Slack, signed interaction bodies and the fake Slack."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from slack_sdk.signature import SignatureVerifier

from broker.domain.config import Config, parse_config
from channels.slack import action_ids as ids
from tests.support.backends import (  # noqa: F401 - redis, broker, api_broker on both backends
    on_backend,
    on_backend_api_broker,
    on_backend_broker,
    stream_entries,
)

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


class FakeSlack:
    """A loopback stand-in for slack.com/api and response_url: records what it is sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_views_open = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode()
                try:
                    body = json.loads(raw) if raw else {}
                except json.JSONDecodeError:
                    body = {"raw": raw}
                fake.calls.append((self.path, body))
                ok = not (self.path.endswith("views.open") and fake.fail_views_open)
                answer = json.dumps(
                    {"ok": ok} if ok else {"ok": False, "error": "expired_trigger_id"}
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_slack() -> Iterator[FakeSlack]:
    fake = FakeSlack()
    yield fake
    fake.close()


@pytest.fixture(name="cfg")
def slack_cfg(fake_slack: FakeSlack) -> Config:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["slack:approvals"], "escalate_to": "managers"},
                "managers": {"channels": ["slack:approvals"]},
                "money": {"channels": ["slack:money"], "roles": ["finance"]},
            },
            "slack": {
                "bot_token": "xoxb-test",
                "signing_secret": SIGNING_SECRET,
                "api_base_url": f"{fake_slack.url}/api",
                "channels": {"approvals": {"channel": "C1"}, "money": {"channel": "C2"}},
            },
            "approvers": {
                "alice": {"roles": ["finance"], "slack_user_id": "U_ALICE"},
                "bob": {"roles": ["ops"], "slack_user_id": "U_BOB"},
            },
        }
    )


def signed(
    payload: dict[str, Any], *, age_s: float = 0, secret: str = SIGNING_SECRET
) -> tuple[bytes, dict[str, str]]:
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time() - age_s))
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    assert signature is not None
    return body, {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


_click_no = iter(range(1_000_000))


def click(
    action_id: str,
    request_id: str,
    user: str = "U_ALICE",
    response_url: str | None = None,
    state: dict[str, Any] | None = None,
    channel: str = "C1",
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower()},
        "channel": {"id": channel, "name": "approvals"},
        "trigger_id": f"trig-{next(_click_no)}",
        "actions": [
            {
                "action_id": action_id,
                "block_id": ids.actions_block_id(request_id),
                "value": request_id,
                "type": "button",
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }
    if response_url:
        payload["response_url"] = response_url
    if state is not None:
        payload["state"] = state
    return payload


def send(client: TestClient, body: bytes, headers: dict[str, str]) -> Any:
    return client.post("/v1/slack/interactions", content=body, headers=headers)
