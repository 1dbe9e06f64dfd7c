"""Webhook replies as an endpoint sends them: Standard Webhooks signatures and the config that checks them."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks.webhooks import Webhook

from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest, Request
from broker.facade import Broker
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker, single_only  # noqa: F401 - redis, broker, api_broker on both backends

OLD_SECRET = "whsec_" + base64.b64encode(b"old-secret-for-ops-endpoint-0123").decode()


NEW_SECRET = "whsec_" + base64.b64encode(b"new-secret-for-ops-endpoint-0123").decode()


OTHER_SECRET = "whsec_" + base64.b64encode(b"someone-else-entirely-0123456789").decode()


@pytest.fixture(name="cfg")
def webhook_cfg() -> Config:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["webhook:ops", "webhook:bare"]},
                "elsewhere": {"channels": ["webhook:bare"]},
                "guarded": {"channels": ["webhook:ops", "webhook:bare"], "roles": ["ops"]},
            },
            "webhooks": {
                "ops": {
                    "url": "http://127.0.0.1:9/ops",
                    "secret": [NEW_SECRET, OLD_SECRET],
                    "roles": ["ops"],
                },
                "bare": {"url": "http://127.0.0.1:9/bare", "secret": OTHER_SECRET},
            },
        }
    )


def signed(
    body: dict[str, Any] | bytes,
    secret: str = NEW_SECRET,
    *,
    msg_id: str = "msg_1",
    age_s: float = 0,
) -> tuple[bytes, dict[str, str]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    when = datetime.fromtimestamp(time.time() - age_s, UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, raw.decode()),
        "content-type": "application/json",
    }
    return raw, headers


def post(client: TestClient, name: str, raw: bytes, headers: dict[str, str]) -> Any:
    return client.post(f"/v1/webhooks/{name}/replies", content=raw, headers=headers)


def make(broker: Broker, **kw: Any) -> Request:
    return broker.create_request(NewRequest(tool_name="restart", args={"svc": "db"}, **kw))
