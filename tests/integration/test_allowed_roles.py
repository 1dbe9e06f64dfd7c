"""`allowed_roles` at create must let someone configured decide the request: an approver, or a
deciding webhook endpoint its queue lists, holding one of them and one of the queue's roles.
Otherwise 422 `unknown_role` and nothing is created, over REST and over `/mcp` alike: a role
held only by a `requester` or an `auditor` (who decide nothing), only by a notify-only endpoint,
only by an endpoint the queue doesn't list, or never together with the queue's roles, would
leave the request to the admin alone."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.facade import Broker
from tests.support.auth import bearer, person
from tests.support.decisions import snapshot

AGENT = "tok-agent-allowed-roles"
SECRET = "whsec_" + base64.b64encode(b"allowed-roles-secret-0123456789a").decode()
API_CONFIG = {
    "queues": {
        "default": {"channels": ["inbox", "webhook:ops", "webhook:audit"]},
        "elsewhere": {"channels": ["inbox"]},
        "money": {"channels": ["inbox"], "roles": ["finance"]},
    },
    "webhooks": {
        "ops": {"url": "http://127.0.0.1:9/ops", "secret": SECRET, "roles": ["ops"]},
        "audit": {
            "url": "http://127.0.0.1:9/audit",
            "secret": SECRET,
            "roles": ["compliance"],
            "decides": False,
        },
    },
    "approvers": {
        "agent": person(AGENT, ["requester"]),
        "reader": person("tok-reader-allowed-roles", ["auditor"]),
        "alice": person("tok-alice-allowed-roles", ["finance"]),
    },
}

REFUSED = {
    "held only by a requester": ("default", ["requester"]),
    "held only by an auditor": ("default", ["auditor"]),
    "held only by a notify-only endpoint": ("default", ["compliance"]),
    "held only by an endpoint the queue doesn't list": ("elsewhere", ["ops"]),
    "never with the queue's roles": ("money", ["ops"]),
}
ACCEPTED = {
    "a deciding endpoint the queue lists": ("default", ["ops"]),
    "an approver with the queue's role": ("money", ["finance"]),
    "one of them decidable": ("money", ["ops", "finance"]),
    "none: any approver": ("default", []),
}


def mcp_call(client: TestClient, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "request_approval", "arguments": arguments},
    }
    headers = {
        **bearer(AGENT),
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-06-18",
    }
    resp = client.post("/mcp", json=body, headers=headers)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


@pytest.mark.parametrize(("queue", "roles"), REFUSED.values(), ids=REFUSED.keys())
def test_allowed_roles_nobody_may_decide_with_are_refused_over_rest_and_mcp(
    queue: str, roles: list[str], client: TestClient, api_broker: Broker
) -> None:
    before = snapshot(api_broker.redis)
    body = {"tool_name": "wire", "args": {}, "queue": queue, "allowed_roles": roles}
    resp = client.post("/v1/requests", json=body, headers=bearer(AGENT))
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"] == "unknown_role" and queue in resp.json()["detail"]
    result = mcp_call(client, body)
    assert result["isError"] and result["structuredContent"]["error"] == "unknown_role"
    assert snapshot(api_broker.redis) == before


@pytest.mark.parametrize(("queue", "roles"), ACCEPTED.values(), ids=ACCEPTED.keys())
def test_allowed_roles_someone_may_decide_with_are_created(
    queue: str, roles: list[str], client: TestClient
) -> None:
    body = {"tool_name": "wire", "args": {}, "queue": queue, "allowed_roles": roles}
    resp = client.post("/v1/requests", json=body, headers=bearer(AGENT))
    assert resp.status_code == 201, resp.text
    result = mcp_call(client, body)
    assert not result["isError"], result
    assert result["structuredContent"]["allowed_roles"] == roles
