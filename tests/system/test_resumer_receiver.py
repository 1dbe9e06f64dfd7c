"""bench/webhook_receiver.py, the e2e bench's webhook receiver: verifies, records, replies signed."""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_" + base64.b64encode(b"receiver-test-secret-0123456789ab").decode()


class FakeApi(BaseHTTPRequestHandler):
    """Takes the replies; each is verified with the endpoint's secret, as the API does."""

    replies: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        payload = Webhook(SECRET).verify(body, dict(self.headers.items()))
        self.replies.append((self.path, payload))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, int]]:
    api = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    FakeApi.replies = []
    threading.Thread(target=api.serve_forever, daemon=True).start()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "webhook_receiver.py"), "--secret", SECRET,
         "--api", f"http://127.0.0.1:{api.server_address[1]}", "--endpoint", "bench"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        yield "127.0.0.1", int(line.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(10)
        api.shutdown()


def _delivery(kind: str, rid: str, *, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"type": kind, "data": {"id": rid, "status": "pending"}}).encode()
    msg_id, now = f"msg_{kind}_{rid}", datetime.now(UTC)
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, body.decode()),
    }
    return body, headers


def test_deliveries_are_verified_and_a_request_is_answered_once_signed(
    receiver: tuple[str, int],
) -> None:
    conn = http.client.HTTPConnection(*receiver, timeout=10)  # one kept-alive connection
    statuses = []
    other = "whsec_" + base64.b64encode(b"some-other-secret-0123456789abcd").decode()
    for body, headers in [
        _delivery("approval.requested", "req_1"),
        _delivery("approval.requested", "req_1"),  # redelivered: no second reply
        _delivery("approval.decided", "req_1"),
        _delivery("approval.requested", "req_2", secret=other),  # forged
    ]:
        conn.request("POST", "/hook", body, headers)
        reply = conn.getresponse()
        reply.read()
        statuses.append(reply.status)
    assert statuses == [204, 204, 204, 401]
    [(path, payload)] = wait_for(lambda: FakeApi.replies)
    assert path == "/v1/webhooks/bench/replies"
    assert payload == {"request_id": "req_1", "outcome": "approved", "decided_by": "fleet-bot"}
    conn.request("POST", "/hook", b"{", {"content-type": "application/json"})
    unsigned = conn.getresponse()
    unsigned.read()
    assert unsigned.status == 401

    conn.request("GET", "/stats")
    stats = json.loads(conn.getresponse().read())
    assert stats["received"] == 3 and stats["redelivered"] == 1
    assert stats["bad_signature"] == 2 and stats["requests"] == 1
    wait_for(lambda: _stats(receiver).get("reply_200") == 1)
    conn.request("GET", "/times")
    times = json.loads(conn.getresponse().read())
    assert list(times["requested"]) == ["req_1"]
    assert abs(times["requested"]["req_1"] - time.time()) < 60
    conn.request("GET", "/nothing")
    missing = conn.getresponse()
    assert (missing.status, missing.read()) == (404, b"not found")


def _stats(address: tuple[str, int]) -> dict[str, Any]:
    conn = http.client.HTTPConnection(*address, timeout=10)
    conn.request("GET", "/stats")
    return json.loads(conn.getresponse().read())


def test_a_malformed_request_is_answered_400_and_closed(receiver: tuple[str, int]) -> None:
    import socket

    with socket.create_connection(receiver, timeout=10) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        answer = sock.recv(1000)
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert sock.recv(1000) == b""  # closed
