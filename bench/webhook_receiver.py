"""The benchmark's deciding webhook receiver: a small Starlette app on uvicorn, one event loop.

It does what `tests.support.fakes.deciding_receiver` does for the e2e benchmark: verifies every delivery
with `standardwebhooks`, records when each request's `approval.requested` first arrived, and
answers it with a reply signed with the endpoint's secret, POSTed to
`/v1/webhooks/{endpoint}/replies` on the API processes in turn (a connection error or 5xx goes
to the next after a short back-off; a 409 is the answer; one `webhook-id` for all tries of a
reply). Stock parts only: uvicorn parses the deliveries, an `aiohttp.ClientSession` per API
sends the replies from the same loop (no thread pool). It stands for a system on another
machine, so it should take as little of the benchmark's two cores as it can: aiohttp's client
costs about a third of httpx's CPU per request (bench_api.py `--client`), and with httpx the
receiver was the largest consumer of CPU per cycle.

    python bench/webhook_receiver.py --secret whsec_... --api http://127.0.0.1:8001 [--api ...]

`GET /stats` gives counts (`reply_200`, ...), `GET /times` when each request arrived and was
answered (epoch seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvicorn
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fakes.deciding_receiver import Policy, mix_policy, parse_mix  # noqa: E402

REQUESTED = "approval.requested"
GIVE_UP_AFTER_S = 120.0


class Receiver:
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
        self.api_urls = api_urls
        self._clients: list[aiohttp.ClientSession] = []
        self._next = 0
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
                headers = {
                    "content-type": "application/json",
                    "webhook-id": msg_id,
                    "webhook-timestamp": str(int(now.timestamp())),
                    "webhook-signature": self.webhook.sign(msg_id, now, body),
                }
                try:
                    status, data = await self._post(path, headers, raw)
                except (aiohttp.ClientError, TimeoutError) as exc:
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

    async def _post(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        """POST to the API processes in turn; (status, its JSON object or {})."""
        if not self._clients:
            self._clients = [
                aiohttp.ClientSession(
                    base_url=url,
                    connector=aiohttp.TCPConnector(limit=self._concurrency),
                    timeout=aiohttp.ClientTimeout(total=30.0),
                )
                for url in self.api_urls
            ]
        client = self._clients[self._next % len(self._clients)]
        self._next += 1
        async with client.post(path, headers=headers, data=body) as response:
            content = await response.read()
            status = response.status
        try:
            data = orjson.loads(content) if content else {}
        except orjson.JSONDecodeError:
            data = {}
        return status, data if isinstance(data, dict) else {}

    async def close(self) -> None:
        for client in self._clients:
            await client.close()

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


def app(receiver: Receiver) -> Starlette:
    """Deliveries are POSTed to any path; `GET /stats` and `GET /times` read the counts."""

    async def deliver(request: StarletteRequest) -> Response:
        if request.method != "POST":
            return PlainTextResponse("not found", status_code=404)
        status = receiver.receive(dict(request.headers), await request.body())
        return Response(status_code=status)

    async def stats(request: StarletteRequest) -> Response:
        return JSONResponse(receiver.stats())

    async def times(request: StarletteRequest) -> Response:
        return JSONResponse(receiver.times())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await receiver.close()

    return Starlette(
        routes=[
            Route("/stats", stats, methods=["GET"]),
            Route("/times", times, methods=["GET"]),
            Route("/{path:path}", deliver, methods=["GET", "POST"]),
        ],
        lifespan=lifespan,
    )


async def serve(receiver: Receiver, sock: socket.socket) -> None:
    config = uvicorn.Config(
        app(receiver), loop="uvloop", http="httptools", log_level="warning", backlog=2048
    )
    server = uvicorn.Server(config)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    await server.serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret", required=True)
    parser.add_argument("--api", action="append", required=True, help="API base URL (repeat)")
    parser.add_argument("--endpoint", default="bench")
    parser.add_argument("--mix", default="approve=1")
    parser.add_argument("--threads", type=int, default=16, help="replies in flight at once")
    args = parser.parse_args()
    receiver = Receiver(
        args.secret,
        args.api,
        endpoint=args.endpoint,
        policy=mix_policy(parse_mix(args.mix)),
        concurrency=args.threads,
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    try:
        asyncio.run(serve(receiver, sock))  # uvicorn stops on SIGTERM and SIGINT
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
