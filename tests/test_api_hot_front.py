"""`api.hotfront`: the hot routes answered in front of the server's ASGI layers (issue 18).

Through a real server (api.testing.ServerThread serves as api.server does): an ordinary
decision or webhook reply is answered by the fast path once, not again by the layer inside
the app; what it hands on reaches the route once, body intact; a body without a length or over
the cap goes the long way (413 for the latter); an error the fast path doesn't map is 500
`internal`, as the error middleware answers it in the app.
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks.webhooks import Webhook

import api.fastpaths as fastpaths
from api.app import create_app
from api.hotfront import HotFront
from api.limits import MAX_BODY_BYTES
from api.testing import ServerThread
from broker.auth import hash_token
from broker.client import Broker
from broker.config import Config, Settings, parse_config
from broker.models import NewRequest

TOKEN = "tok-alice-hotfront"
SECRET = "whsec_" + base64.b64encode(b"hotfront-webhook-secret-01234567").decode()


@pytest.fixture
def cfg() -> Config:
    return parse_config(
        {
            "queues": {"default": {"channels": ["inbox", "webhook:ops"], "timeout_s": 600}},
            "webhooks": {"ops": {"url": "http://127.0.0.1:9/ops", "secret": SECRET}},
            "approvers": {"alice": {"token_sha256": hash_token(TOKEN), "roles": ["finance"]}},
        }
    )


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Each call of the fast path's two answers: (route, what it gave: fast or handed on)."""
    seen: list[tuple[str, str]] = []
    real_decide, real_reply = fastpaths._decide, fastpaths._reply

    async def decide(*args: Any) -> Any:
        response = await real_decide(*args)
        seen.append(("decision", "handed on" if response is None else "fast"))
        return response

    async def reply(*args: Any) -> Any:
        response = await real_reply(*args)
        seen.append(("reply", "fast"))
        return response

    monkeypatch.setattr(fastpaths, "_decide", decide)
    monkeypatch.setattr(fastpaths, "_reply", reply)
    return seen


@pytest.fixture
def server(api_broker: Broker, cfg: Config) -> Iterator[ServerThread]:
    with ServerThread(create_app(Settings(), cfg, api_broker)) as running:
        assert isinstance(running.server.config.loaded_app, HotFront)
        yield running


def exchange(url: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection (Connection: close); status, headers, body."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


def post(path: str, body: bytes, *headers: str, length: bool = True) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    size = f"Content-Length: {len(body)}\r\n" if length else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{extra}{size}\r\n"
    ).encode() + body


def decision(request_id: str, body: bytes, content_type: str = "application/json") -> bytes:
    return post(
        f"/v1/requests/{request_id}/decision",
        body,
        f"Authorization: Bearer {TOKEN}",
        f"Content-Type: {content_type}",
    )


def make(broker: Broker) -> str:
    return broker.create_request(NewRequest(tool_name="refund", args={"amount": 5})).id


def test_an_ordinary_decision_is_answered_once_in_front(
    server: ServerThread, api_broker: Broker, calls: list[tuple[str, str]]
) -> None:
    rid = make(api_broker)
    status, headers, body = exchange(server.url, decision(rid, b'{"outcome":"approved"}'))
    assert status == 200, body
    assert json.loads(body)["status"] == "approved"
    assert headers["content-type"] == "application/json"
    assert calls == [("decision", "fast")]  # not judged again by the layer inside the app


def test_what_it_hands_on_reaches_the_route_once_with_its_body(
    server: ServerThread, api_broker: Broker, calls: list[tuple[str, str]]
) -> None:
    rid = make(api_broker)
    status, _, answer = exchange(server.url, decision(rid, b'{"outcome":"approved","x":1}'))
    assert status == 422, answer
    assert json.loads(answer)["error"] == "invalid"
    assert calls == [("decision", "handed on")]
    assert api_broker.get_request(rid).is_pending


def test_a_body_without_a_length_goes_the_long_way(
    server: ServerThread, api_broker: Broker, calls: list[tuple[str, str]]
) -> None:
    rid = make(api_broker)
    body = b'{"outcome":"rejected"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    raw = post(
        f"/v1/requests/{rid}/decision",
        chunked,
        f"Authorization: Bearer {TOKEN}",
        "Content-Type: application/json",
        "Transfer-Encoding: chunked",
        length=False,
    )
    status, _, answer = exchange(server.url, raw)
    assert status == 200, answer
    assert json.loads(answer)["status"] == "rejected"
    assert calls == [("decision", "fast")]  # by the layer inside, after the body limit


def test_a_body_over_the_cap_is_413_before_any_judging(
    server: ServerThread, api_broker: Broker, calls: list[tuple[str, str]]
) -> None:
    rid = make(api_broker)
    raw = decision(rid, b"")
    raw = raw.replace(b"Content-Length: 0", b"Content-Length: %d" % (MAX_BODY_BYTES + 1))
    status, _, answer = exchange(server.url, raw)
    assert status == 413
    assert json.loads(answer)["error"] == "too_large"
    assert calls == []


def test_a_signed_webhook_reply_is_answered_in_front(
    server: ServerThread, api_broker: Broker, calls: list[tuple[str, str]]
) -> None:
    rid = make(api_broker)
    body = json.dumps({"request_id": rid, "outcome": "approved", "decided_by": "bot"})
    now = datetime.now(UTC)
    raw = post(
        "/v1/webhooks/ops/replies",
        body.encode(),
        "Content-Type: application/json",
        "webhook-id: msg_front_1",
        f"webhook-timestamp: {int(now.timestamp())}",
        f"webhook-signature: {Webhook(SECRET).sign('msg_front_1', now, body)}",
    )
    status, _, answer = exchange(server.url, raw)
    assert status == 200, answer
    assert json.loads(answer)["decision"]["decided_by"] == "webhook:ops/bot"
    assert calls == [("reply", "fast")]
    status, _, answer = exchange(server.url, raw)  # the same webhook-id again
    assert status == 409
    assert json.loads(answer)["error"] == "replayed"


def test_an_error_it_does_not_map_is_500_internal_as_in_the_app(
    server: ServerThread,
    api_broker: Broker,
    cfg: Config,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(fastpaths, "_decide", broken)
    rid = make(api_broker)
    status, headers, body = exchange(server.url, decision(rid, b'{"outcome":"approved"}'))
    with TestClient(create_app(Settings(), cfg, api_broker), raise_server_exceptions=False) as c:
        inside = c.post(
            f"/v1/requests/{rid}/decision",
            content=b'{"outcome":"approved"}',
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
    assert (status, json.loads(body)) == (inside.status_code, inside.json())
    assert json.loads(body) == {"error": "internal", "detail": "internal error"}
    assert headers["content-type"] == inside.headers["content-type"]
    assert api_broker.get_request(rid).is_pending
