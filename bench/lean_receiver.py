"""The benchmark's deciding webhook receiver: one event loop, no threads (asyncio on uvloop).

It does what `tests.fakes.deciding_receiver` does for the e2e benchmark: verifies every delivery
with `standardwebhooks`, records when each request's `approval.requested` first arrived, and
answers it with a reply signed with the endpoint's secret, POSTed to
`/v1/webhooks/{endpoint}/replies` on the API processes in turn (a connection error or 5xx goes
to the next after a short back-off; a 409 is the answer; one `webhook-id` for all tries of a
reply). Only the machinery is lean, since the receiver shares the benchmark's two cores: the
deliveries are parsed by httptools in a bare asyncio protocol (no ASGI server), and the
replies go out from the same loop over kept-alive connections (bench/async_http.py) instead
of a thread pool (16 threads and httpcore's pool were most of its CPU), so what the benchmark
measures is the broker, not the fake.

    python bench/lean_receiver.py --secret whsec_... --api http://127.0.0.1:8001 [--api ...]

`GET /stats` gives counts (`reply_200`, ...), `GET /times` when each request arrived and was
answered (epoch seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httptools
import orjson
import uvloop
from standardwebhooks import Webhook, WebhookVerificationError

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from async_http import Clients  # noqa: E402

from tests.fakes.deciding_receiver import Policy, mix_policy, parse_mix  # noqa: E402

REQUESTED = "approval.requested"
GIVE_UP_AFTER_S = 120.0


class LeanReceiver:
    """Verifies deliveries and answers first `approval.requested` events, all on one loop."""

    def __init__(
        self,
        secret: str,
        api_urls: list[str],
        *,
        endpoint: str,
        policy: Policy,
        concurrency: int,
        decided_by: str = "fleet-bot",
    ) -> None:
        self.webhook = Webhook(secret)
        self.endpoint = endpoint
        self.policy = policy
        self.decided_by = decided_by
        self.clients = Clients(api_urls)
        self.counts: Counter[str] = Counter()
        self.requested_at: dict[str, float] = {}
        self.answered_at: dict[str, float] = {}
        self.failures: list[str] = []
        self._slots: asyncio.Semaphore | None = None
        self._concurrency = concurrency
        self._tasks: set[asyncio.Task[None]] = set()

    def receive(self, headers: dict[str, str], body: bytes) -> int:
        """Verify and record one delivery; a first `approval.requested` gets its reply queued."""
        try:
            self.webhook.verify(body, headers, json_parse=False)
        except (WebhookVerificationError, ValueError):
            self.counts["bad_signature"] += 1
            return 401
        try:
            payload = orjson.loads(body)  # the package's json.loads was a tenth of the receiver
        except orjson.JSONDecodeError:
            return 400
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
            return 400
        self.counts["received"] += 1
        if payload.get("type") != REQUESTED:
            return 204
        request = payload["data"]
        rid = str(request.get("id", ""))
        if rid in self.requested_at:
            self.counts["redelivered"] += 1
            return 204
        self.requested_at[rid] = time.time()
        reply = self.policy(request)
        if reply is None:
            self.counts["ignored"] += 1
            return 204
        task = asyncio.get_running_loop().create_task(self._answer(rid, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return 204

    async def _answer(self, rid: str, reply: dict[str, Any]) -> None:
        """Send one reply until the API gives a final answer (200, 409, or a 4xx that is a bug)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._concurrency)
        body = json.dumps({"request_id": rid, **reply, "decided_by": self.decided_by})
        raw = body.encode()
        msg_id = f"msg_reply_{rid}"
        path = f"/v1/webhooks/{self.endpoint}/replies"
        deadline = time.monotonic() + GIVE_UP_AFTER_S
        delay, tries = 0.05, 0
        async with self._slots:
            while True:
                tries += 1
                now = datetime.now(UTC)
                headers = (
                    f"content-type: application/json\r\nwebhook-id: {msg_id}\r\n"
                    f"webhook-timestamp: {int(now.timestamp())}\r\n"
                    f"webhook-signature: {self.webhook.sign(msg_id, now, body)}\r\n"
                )
                try:
                    status, data = await self.clients.post(path, headers, raw)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    status, data = 0, {"error": type(exc).__name__}
                if status == 200:
                    self._done(rid, 200)
                    return
                if status == 409:
                    current = data.get("request") or {}
                    if data.get("error") == "replayed" and current.get("status") == "pending":
                        self.counts["replayed_but_pending"] += 1  # the API died in between
                        msg_id = f"msg_reply_{rid}_{tries}"
                    else:
                        self._done(rid, 409)
                        return
                elif 400 <= status < 500 and status not in (408, 429):
                    self.failures.append(f"{rid}: HTTP {status} {data}")
                    return
                self.counts["reply_retries"] += 1
                if time.monotonic() > deadline:
                    self.failures.append(f"{rid}: gave up after {tries} tries (last {status})")
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _done(self, rid: str, status: int) -> None:
        self.answered_at[rid] = time.time()
        self.counts[f"reply_{status}"] += 1

    def stats(self) -> dict[str, Any]:
        return {
            **self.counts,
            "requests": len(self.requested_at),
            "answered": len(self.answered_at),
            "failures": len(self.failures),
        }

    def times(self) -> dict[str, dict[str, float]]:
        return {"requested": dict(self.requested_at), "answered": dict(self.answered_at)}


REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}


def response(status: int, body: bytes = b"", *, close: bool = False) -> bytes:
    head = f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\ncontent-length: {len(body)}\r\n"
    return (head + ("connection: close\r\n" if close else "") + "\r\n").encode() + body


CANNED = {status: response(status) for status in (204, 400, 401)}


class HookServer(asyncio.Protocol):
    """One HTTP/1.1 connection (keep-alive, no pipelining needed), parsed by httptools.

    The deliveries' only work is the receiver's: uvicorn's ASGI cycle (scope, receive/send
    messages, header lists) was most of the receiver's CPU beside the signature checks.
    """

    def __init__(self, receiver: LeanReceiver) -> None:
        self.receiver = receiver
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(response(400, close=True))
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.parser.get_method() == b"POST":
            status = self.receiver.receive(self.headers, b"".join(self.body))
            out = CANNED.get(status) or response(status)
        else:
            path = self.url.split(b"?", 1)[0]
            if path == b"/stats":
                out = response(200, json.dumps(self.receiver.stats()).encode())
            elif path == b"/times":
                out = response(200, json.dumps(self.receiver.times()).encode())
            else:
                out = response(404, b"not found")
        self.transport.write(out)
        if not self.parser.should_keep_alive():
            self.transport.close()


async def serve(receiver: LeanReceiver, sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HookServer(receiver), sock=sock, backlog=2048)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret", required=True)
    parser.add_argument("--api", action="append", required=True, help="API base URL (repeat)")
    parser.add_argument("--endpoint", default="bench")
    parser.add_argument("--mix", default="approve=1")
    parser.add_argument("--threads", type=int, default=16, help="replies in flight at once")
    args = parser.parse_args()
    receiver = LeanReceiver(
        args.secret,
        args.api,
        endpoint=args.endpoint,
        policy=mix_policy(parse_mix(args.mix)),
        concurrency=args.threads,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvloop.install()
    try:
        asyncio.run(serve(receiver, sock))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
