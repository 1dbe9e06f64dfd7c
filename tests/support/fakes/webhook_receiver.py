"""A webhook receiver on loopback that verifies Standard Webhooks signatures.

Every POST is verified with the `standardwebhooks` package against the receiver's secrets; a
bad signature gets 401. What a verified delivery is answered with is programmable per path:
`plan("/hook", [500, 503])` answers the next two with those statuses (then the default),
`default("/gone", 410)` answers every one; `delay["/slow"] = 0.3` makes a path answer late.
`GET /stats` gives counts (for the benchmark).

Run alone: `python -m tests.support.fakes.webhook_receiver --secret whsec_... [--port N] [--no-record]`.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.fakes._http import QuietHandler, ServerThread, serve_until_stopped

Answer = int | tuple[int, dict[str, str]]


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    status: int
    at: float = field(default_factory=time.monotonic)

    @property
    def id(self) -> str:
        return self.headers.get("webhook-id", "")

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


class _Handler(QuietHandler):
    def do_POST(self) -> None:
        receiver: WebhookReceiver = self.server.owner  # type: ignore[attr-defined]
        body = self.read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, extra = receiver.receive(self.path, headers, body)
        self.reply(status, "" if status != 401 else "bad signature", extra)

    def do_GET(self) -> None:
        receiver: WebhookReceiver = self.server.owner  # type: ignore[attr-defined]
        if self.path == "/stats":
            self.reply(200, receiver.stats())
        else:
            self.reply(404, "not found")


class WebhookReceiver:
    def __init__(self, secrets: str | list[str], *, record: bool = True, port: int = 0) -> None:
        self.verifiers = [Webhook(s) for s in ([secrets] if isinstance(secrets, str) else secrets)]
        self.record = record
        self.deliveries: list[Delivery] = []
        self._plans: dict[str, deque[Answer]] = defaultdict(deque)
        self._defaults: dict[str, Answer] = {}
        self.delay: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._counts = {"received": 0, "accepted": 0, "rejected": 0}
        self._ids: set[str] = set()
        self._server = ServerThread(_Handler, self, port)

    def start(self) -> WebhookReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def port(self) -> int:
        return self._server.port

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def plan(self, path: str, answers: list[Answer]) -> None:
        with self._lock:
            self._plans[path].extend(answers)

    def default(self, path: str, answer: Answer) -> None:
        with self._lock:
            self._defaults[path] = answer

    def verify(self, headers: dict[str, str], body: bytes) -> bool:
        for verifier in self.verifiers:
            try:
                verifier.verify(body, headers)
                return True
            except WebhookVerificationError:
                continue
        return False

    def receive(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str]]:
        verified = self.verify(headers, body)
        if self.delay[path]:
            time.sleep(self.delay[path])  # simulated endpoint latency, not synchronisation
        with self._lock:
            self._counts["received"] += 1
            if not verified:
                answer: Answer = 401
                self._counts["rejected"] += 1
            elif self._plans[path]:
                answer = self._plans[path].popleft()
            else:
                answer = self._defaults.get(path, 204)
            status, extra = answer if isinstance(answer, tuple) else (answer, {})
            if verified and 200 <= status < 300:
                self._counts["accepted"] += 1
                self._ids.add(headers.get("webhook-id", ""))
            if self.record:
                self.deliveries.append(Delivery(path, headers, body, verified, status))
        return status, extra

    def to(self, path: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.path == path]

    def accepted(self, path: str | None = None) -> list[Delivery]:
        with self._lock:
            return [
                d
                for d in self.deliveries
                if d.verified and 200 <= d.status < 300 and (path is None or d.path == path)
            ]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._counts, "unique_ids": len(self._ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret", action="append", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--no-record", action="store_true", help="count only (for benchmarks)")
    args = parser.parse_args()
    receiver = WebhookReceiver(args.secret, record=not args.no_record, port=args.port).start()
    print(f"listening on http://127.0.0.1:{receiver.port}", flush=True)
    serve_until_stopped(receiver)


if __name__ == "__main__":
    main()
