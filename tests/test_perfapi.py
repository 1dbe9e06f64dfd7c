"""The lean hot path (api.fastpaths) answers exactly as the FastAPI routes it stands in front of.

Each case is sent twice, on twin requests: through the app as built (fast path in front) and
through the same app without the fast path. Status, error code, detail and headers that matter
must match; ordinary decisions must really be answered by the fast path, and unusual ones
handed on to the route with their body intact.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from standardwebhooks.webhooks import Webhook

import api.fastpaths as fastpaths
from api.app import create_app
from api.fastpaths import FastPaths
from api.limits import MAX_BODY_BYTES
from broker.auth import hash_token
from broker.client import Broker
from broker.config import Config, Settings, parse_config
from broker.models import NewRequest, Request

TOKENS = {"alice": "tok-alice-perfapi", "bob": "tok-bob-perfapi"}
SECRET = "whsec_" + base64.b64encode(b"perfapi-webhook-secret-0123456789").decode()


@pytest.fixture
def cfg() -> Config:
    return parse_config(
        {
            "queues": {"default": {"channels": ["inbox", "webhook:ops"], "timeout_s": 600}},
            "webhooks": {"ops": {"url": "http://127.0.0.1:9/ops", "secret": SECRET}},
            "approvers": {
                "alice": {"token_sha256": hash_token(TOKENS["alice"]), "roles": ["finance"]},
                "bob": {"token_sha256": hash_token(TOKENS["bob"]), "roles": ["ops"]},
            },
        }
    )


def without_fast_path(app: FastAPI) -> FastAPI:
    app.user_middleware = [m for m in app.user_middleware if m.cls is not FastPaths]
    return app


@pytest.fixture
def clients(api_broker: Broker, cfg: Config) -> Iterator[tuple[TestClient, TestClient]]:
    fast = create_app(Settings(), cfg, api_broker)
    plain = without_fast_path(create_app(Settings(), cfg, api_broker))
    with TestClient(fast) as f, TestClient(plain) as p:
        yield f, p


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the decisions the fast path answered itself."""
    answered: list[str] = []
    real = fastpaths._decide

    async def counting(state: Any, hot: Any, scope: Any, request_id: str, body: bytes) -> Any:
        response = await real(state, hot, scope, request_id, body)
        if response is not None:
            answered.append(request_id)
        return response

    monkeypatch.setattr(fastpaths, "_decide", counting)
    return answered


def make(broker: Broker, **kw: Any) -> Request:
    return broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}, **kw))


def auth(who: str | None, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {TOKENS.get(who or '', 'not-a-token')}"} if who else {}


# (who, content type, body, allowed_roles): each case is one decision POST
CASES: dict[str, tuple[str | None, str, bytes, list[str]]] = {
    "approved": ("alice", "application/json", b'{"outcome": "approved"}', []),
    "json with charset": (
        "alice",
        "application/json; charset=utf-8",
        b'{"outcome":"rejected"}',
        [],
    ),
    "wrong role, out of sight 404": (
        "bob",
        "application/json",
        b'{"outcome": "approved"}',
        ["finance"],
    ),
    "no token 401": (None, "application/json", b'{"outcome": "approved"}', []),
    "bad token 401": ("mallory", "application/json", b'{"outcome": "approved"}', []),
    "bad outcome 422": ("alice", "application/json", b'{"outcome": "maybe"}', []),
    "extra field 422": ("alice", "application/json", b'{"outcome":"approved","x":1}', []),
    "not json 422": ("alice", "application/json", b"{nope", []),
    "nan 422": ("alice", "application/json", b'{"outcome":"modified","args":{"a":NaN}}', []),
    "text/plain": ("alice", "text/plain", b'{"outcome": "approved"}', []),
    "timed_out 422": ("alice", "application/json", b'{"outcome": "timed_out"}', []),
}


def comparable(resp: Any) -> dict[str, Any]:
    body = resp.json()
    if isinstance(body, dict) and "error" in body:
        shape: Any = {k: body[k] for k in ("error", "detail")}
        shape["detail"] = shape["detail"].replace(body.get("request", {}).get("id", "-"), "ID")
    else:
        shape = {k: body[k] for k in ("status", "tool_name", "queue")}
        shape["decided_by"] = body["decision"]["decided_by"]
        shape["outcome"] = body["decision"]["outcome"]
    return {
        "status": resp.status_code,
        "body": shape,
        "www-authenticate": resp.headers.get("www-authenticate"),
        "content-type": resp.headers.get("content-type"),
    }


@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_answers_as_the_route_does(
    case: str, clients: tuple[TestClient, TestClient], api_broker: Broker
) -> None:
    who, content_type, body, roles = CASES[case]
    answers = []
    for client in clients:
        req = make(api_broker, allowed_roles=roles)
        headers = {"Content-Type": content_type, **auth(who)}
        resp = client.post(f"/v1/requests/{req.id}/decision", content=body, headers=headers)
        answer = comparable(resp)
        answer["body"]["detail"] = answer["body"].get("detail", "").replace(req.id, "ID")
        answers.append(answer)
    assert answers[0] == answers[1]
    assert answers[0]["status"] != 500


def test_ordinary_decisions_are_answered_by_the_fast_path(
    clients: tuple[TestClient, TestClient], api_broker: Broker, spy: list[str]
) -> None:
    fast, _ = clients
    req = make(api_broker)
    resp = fast.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=auth("alice")
    )
    assert resp.status_code == 200 and resp.json()["decision"]["decided_by"] == "alice"
    assert spy == [req.id]
    again = fast.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=auth("alice")
    )
    assert again.status_code == 200  # the same decision repeated: not an error
    loser = fast.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "rejected"}, headers=auth("alice")
    )
    assert loser.status_code == 409 and loser.json()["request"]["decision"]["outcome"] == "approved"
    assert spy == [req.id, req.id]  # the 409 came from the fast path too, mapped by api.errors


def test_declined_decisions_reach_the_route_with_their_body(
    clients: tuple[TestClient, TestClient],
    api_broker: Broker,
    spy: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, _ = clients
    req = make(api_broker)
    # a request the fast path declines after reading the body: the route must still get it
    monkeypatch.setattr(fastpaths, "_is_json", lambda scope: False)
    resp = fast.post(
        f"/v1/requests/{req.id}/decision",
        json={"outcome": "approved", "reason": "ok"},
        headers=auth("alice"),
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["decision"]["reason"] == "ok"  # the route read the replayed body
    assert spy == []


def test_body_limit_is_checked_before_the_fast_path(
    clients: tuple[TestClient, TestClient], api_broker: Broker
) -> None:
    fast, _ = clients
    req = make(api_broker)
    big = json.dumps({"outcome": "approved", "reason": "x" * MAX_BODY_BYTES}).encode()

    def chunks() -> Iterator[bytes]:  # no Content-Length: streamed
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    resp = fast.post(
        f"/v1/requests/{req.id}/decision",
        content=chunks(),
        headers={"Content-Type": "application/json", **auth("alice")},
    )
    assert resp.status_code == 413 and resp.json()["error"] == "too_large"
    assert api_broker.get_request(req.id).is_pending


def signed(body: bytes, msg_id: str, secret: str = SECRET) -> dict[str, str]:
    now = datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, body.decode()),
        "content-type": "application/json",
    }


OTHER = "whsec_" + base64.b64encode(b"not-the-endpoint-secret-01234567").decode()
REPLY_CASES: dict[str, tuple[str, str, str]] = {  # name, body template, secret
    "approved": ("ops", '{"request_id": "ID", "outcome": "approved"}', SECRET),
    "by a person": (
        "ops",
        '{"request_id": "ID", "outcome": "rejected", "decided_by": "d"}',
        SECRET,
    ),
    "forged 401": ("ops", '{"request_id": "ID", "outcome": "approved"}', OTHER),
    "unknown endpoint 404": ("nope", '{"request_id": "ID", "outcome": "approved"}', SECRET),
    "bad body 422": ("ops", '{"request_id": "ID", "outcome": "maybe"}', SECRET),
    "not json 422": ("ops", "{nope", SECRET),
    "unknown request 404": ("ops", '{"request_id": "req_none", "outcome": "approved"}', SECRET),
}


@pytest.mark.parametrize("case", list(REPLY_CASES))
def test_webhook_fast_path_answers_as_the_route_does(
    case: str, clients: tuple[TestClient, TestClient], api_broker: Broker
) -> None:
    name, template, secret = REPLY_CASES[case]
    answers = []
    for i, client in enumerate(clients):
        req = make(api_broker)
        body = template.replace("ID", req.id).encode()
        headers = signed(body, f"msg_{case}_{i}", secret)
        first = client.post(f"/v1/webhooks/{name}/replies", content=body, headers=headers)
        replay = client.post(f"/v1/webhooks/{name}/replies", content=body, headers=headers)
        answers.append(
            [
                {k: v.replace(req.id, "ID") if isinstance(v, str) else v for k, v in a.items()}
                for a in (comparable(first), comparable(replay))
            ]
        )
        answers[-1].append(api_broker.get_request(req.id).status.value)
    assert answers[0] == answers[1]
    assert all(a["status"] != 500 for a in answers[0][:2])


def test_replayed_webhook_id_is_409_through_the_fast_path(
    clients: tuple[TestClient, TestClient], api_broker: Broker
) -> None:
    fast, _ = clients
    req = make(api_broker)
    body = json.dumps({"request_id": req.id, "outcome": "approved"}).encode()
    headers = signed(body, "msg_once")
    assert fast.post("/v1/webhooks/ops/replies", content=body, headers=headers).status_code == 200
    again = fast.post("/v1/webhooks/ops/replies", content=body, headers=headers)
    assert again.status_code == 409 and again.json()["error"] == "replayed"
    assert again.json()["request"]["decision"]["decided_by"] == "webhook:ops"
