"""Signed Slack interactions, as Slack sends them, for tests that click approve or ack."""

from __future__ import annotations

import json
import time
from itertools import count
from urllib.parse import urlencode

from slack_sdk.signature import SignatureVerifier

from channels.slack import action_ids as ids
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker, single_only  # noqa: F401 - redis, broker, api_broker on both backends

SIGNING = "8f742231b10e8888abcd99yyyzzz85a5"


_ids = count()


def slack_click(user: str, request_id: str, action: str = ids.APPROVE) -> tuple[bytes, dict]:
    payload = {
        "type": "block_actions",
        "user": {"id": user},
        "channel": {"id": "C1"},
        "trigger_id": f"trig-{next(_ids)}",
        "actions": [{"action_id": action, "value": request_id, "type": "button"}],
    }
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()))
    sig = SignatureVerifier(SIGNING).generate_signature(timestamp=ts, body=body)
    headers = {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": str(sig),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    return body, headers
