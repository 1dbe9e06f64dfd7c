"""A large signed webhook reply's signature check runs off the event loop; a small one on it.

Checking a signature is an HMAC over the whole body per secret in force: milliseconds for a
1 MiB one with a few secrets, and on the loop nothing else would be served meanwhile, so a
body over `INLINE_BODY` is checked in a thread. A reply of the usual size (a few hundred
bytes, microseconds to check) is checked on the loop: a thread hop would cost more than the
check. The answer is the same for every size.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks.webhooks import Webhook

from api.app import create_app
from broker.domain.config import Config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.webhook import routes as webhooks

OLD = "whsec_" + base64.b64encode(b"hot-webhook-old-secret-0123456789").decode()
NEW = "whsec_" + base64.b64encode(b"hot-webhook-new-secret-0123456789").decode()


API_CONFIG = {
    "queues": {"default": {"channels": ["webhook:ops"]}},
    "webhooks": {"ops": {"url": "http://127.0.0.1:9/ops", "secret": [OLD, NEW], "roles": ["ops"]}},
}


@pytest.fixture
def on_loop(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each signature check: did it run with an event loop running in its thread?"""
    seen: list[bool] = []
    real = webhooks.verify

    def spying(*args: Any, **kwargs: Any) -> None:
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:
            seen.append(False)
        real(*args, **kwargs)

    monkeypatch.setattr(webhooks, "verify", spying)
    return seen


@pytest.fixture
def client(api_broker: Broker, cfg: Config) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(), cfg, api_broker)) as c:
        yield c


def signed(body: bytes, msg_id: str) -> dict[str, str]:
    now = datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(NEW).sign(msg_id, now, body.decode()),
        "content-type": "application/json",
    }


@pytest.mark.parametrize(
    ("padding", "on_the_loop"), [(0, True), (32 * 1024 - 200, False), (600 * 1024, False)]
)
def test_a_large_reply_is_verified_off_the_loop_and_a_small_one_on_it(
    padding: int,
    on_the_loop: bool,
    client: TestClient,
    api_broker: Broker,
    on_loop: list[bool],
) -> None:
    req = api_broker.create_request(NewRequest(tool_name="refund", args={}))
    body = json.dumps({"request_id": req.id, "outcome": "approved"}).encode() + b" " * padding
    resp = client.post("/v1/webhooks/ops/replies", content=body, headers=signed(body, "msg_big"))
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "approved"
    assert api_broker.get_request(req.id).status.value == "approved"
    assert on_loop == [on_the_loop]


def test_a_large_reply_with_a_bad_signature_is_401_from_the_thread(
    client: TestClient, api_broker: Broker, on_loop: list[bool]
) -> None:
    req = api_broker.create_request(NewRequest(tool_name="refund", args={}))
    body = json.dumps({"request_id": req.id, "outcome": "approved"}).encode() + b" " * 600_000
    headers = signed(body, "msg_bad") | {"webhook-signature": "v1,AAAA"}
    resp = client.post("/v1/webhooks/ops/replies", content=body, headers=headers)
    assert resp.status_code == 401 and resp.json()["error"] == "bad_signature"
    assert on_loop == [False]
    assert api_broker.get_request(req.id).is_pending
