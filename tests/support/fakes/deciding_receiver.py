"""A webhook receiver that plays the people at a webhook endpoint: it decides what it is sent.

Every POST is verified (Standard Webhooks) like `tests.support.fakes.webhook_receiver`, answered 204
at once, and recorded. For an `approval.requested` event seen for the first time, a `policy`
says what to answer (`{"outcome": "approved"}`, `{"outcome": "rejected", "reason": ...}`, or
None to leave it unanswered), and a pool of threads signs that reply with the endpoint's secret
and POSTs it to `/v1/webhooks/{endpoint}/replies` on one of the API processes, as a real
integration would: a connection error or 5xx goes to the next API process after a short
back-off, a 409 is the answer (someone else decided, or the sweeper timed it out), and a reply
is sent under one `webhook-id` for all its tries.

What it meant to do with each request is kept in `intents` (approve, reject or silent, with the
request's `expires_at`), and how each reply ended in `answered` (with when the try that got the
answer was sent and answered), so a test can hold every recorded outcome against the intent.

Run alone (for benchmarks): `python -m tests.support.fakes.deciding_receiver --secret whsec_...
--api http://127.0.0.1:8001 [--api ...] [--mix approve=1] [--port N]`; it prints
`listening on URL`, and `GET /stats` gives counts, `GET /times` when each request arrived and
was decided.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpcore
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.fakes._http import QuietHandler, ServerThread, serve_until_stopped

Reply = dict[str, Any]
Policy = Callable[[dict[str, Any]], Reply | None]

REQUESTED = "approval.requested"
OUTCOME_EVENTS = ("approval.decided", "approval.timed_out")
INTENT_OF = {"approved": "approve", "rejected": "reject"}
"""The intent a reply's outcome stands for; no reply at all is the intent "silent"."""


@dataclass(frozen=True)
class Intent:
    """What the receiver meant to do with one request, fixed when it first arrived."""

    request_id: str
    action: str  # "approve" | "reject" | "silent"
    reply: Reply | None
    expires_at: float  # the request's expires_at (epoch seconds), as the event carried it
    seen_at: float


def _epoch(value: Any) -> float:
    """An ISO 8601 time from an event as epoch seconds (NaN if missing or malformed)."""
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return float("nan")


@dataclass
class Answered:
    """How one reply ended: `status` 200 (recorded), 409 (someone else won), or an error."""

    request_id: str
    outcome: str
    status: int
    final_status: str  # the request's status as the API reported it
    tries: int
    sent_at: float = 0.0
    """When the try that got this answer was sent (wall clock)."""
    at: float = field(default_factory=time.time)
    """When that answer arrived."""


class _Handler(QuietHandler):
    def do_POST(self) -> None:
        receiver: DecidingReceiver = self.server.owner  # type: ignore[attr-defined]
        body = self.read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.reply(receiver.receive(headers, body))

    def do_GET(self) -> None:
        receiver: DecidingReceiver = self.server.owner  # type: ignore[attr-defined]
        if self.path == "/stats":
            self.reply(200, receiver.stats())
        elif self.path == "/times":
            self.reply(200, receiver.times())
        else:
            self.reply(404, "not found")


def mix_policy(mix: dict[str, float], reason: str = "Not covered by the refund policy") -> Policy:
    """Approve, reject or ignore each request by a stable hash of its id, in the given shares."""
    total = sum(mix.values())
    bands: list[tuple[float, str]] = []
    edge = 0.0
    for action, share in mix.items():
        edge += share / total
        bands.append((edge, action))

    def policy(request: dict[str, Any]) -> Reply | None:
        digest = hashlib.sha256(str(request["id"]).encode()).digest()
        point = int.from_bytes(digest[:8], "big") / 2**64
        action = next((a for e, a in bands if point < e), bands[-1][1])
        if action == "approve":
            return {"outcome": "approved"}
        if action == "reject":
            return {"outcome": "rejected", "reason": reason}
        return None

    return policy


class DecidingReceiver:
    """Receives and verifies webhooks; answers new requests through the API's reply endpoint."""

    def __init__(
        self,
        secret: str,
        api_urls: list[str],
        *,
        endpoint: str,
        policy: Policy,
        decided_by: str = "fleet-bot",
        threads: int = 8,
        give_up_after_s: float = 120.0,
        port: int = 0,
    ) -> None:
        self.webhook = Webhook(secret)
        self.api_urls = list(api_urls)
        self.endpoint = endpoint
        self.policy = policy
        self.decided_by = decided_by
        self.give_up_after_s = give_up_after_s
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.requested_at: dict[str, float] = {}
        """When each request's `approval.requested` first arrived (wall clock)."""
        self.requested_times: Counter[str] = Counter()
        self.outcomes: dict[str, set[tuple[str, str]]] = {}
        """Per request: the (event type, webhook-id) pairs of its outcome events."""
        self.intents: dict[str, Intent] = {}
        """Per request: what the policy said to do with it when it first arrived."""
        self.answered: dict[str, Answered] = {}
        self.failures: list[str] = []
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="decide")
        self._http = httpcore.ConnectionPool(max_connections=threads * 2)
        self._server = ServerThread(_Handler, self, port)
        self._started = False
        self._next_api = 0

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> DecidingReceiver:
        self._server.start()
        self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            self._server.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._http.close()

    @property
    def port(self) -> int:
        return self._server.port

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    # ---- receiving ---------------------------------------------------------------------

    def receive(self, headers: dict[str, str], body: bytes) -> int:
        """Verify and record one delivery; a first `approval.requested` is queued for deciding."""
        try:
            payload = self.webhook.verify(body, headers)
        except (WebhookVerificationError, ValueError):
            with self._lock:
                self.counts["bad_signature"] += 1
            return 401
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
            return 400
        kind = payload.get("type")
        request = payload["data"]
        rid = str(request.get("id", ""))
        msg_id = headers.get("webhook-id", "")
        first = False
        with self._lock:
            self.counts["received"] += 1
            if kind == REQUESTED:
                self.requested_times[rid] += 1
                if rid not in self.requested_at:
                    self.requested_at[rid] = time.time()
                    first = True
                else:
                    self.counts["redelivered"] += 1
            elif kind in OUTCOME_EVENTS:
                self.outcomes.setdefault(rid, set()).add((kind, msg_id))
        if first:
            reply = self.policy(request)
            action = "silent" if reply is None else INTENT_OF.get(str(reply.get("outcome")), "?")
            intent = Intent(rid, action, reply, _epoch(request.get("expires_at")), time.time())
            with self._lock:
                self.intents[rid] = intent
                if reply is None:
                    self.counts["ignored"] += 1
            if reply is not None:
                self._pool.submit(self._answer, rid, reply)
        return 204

    # ---- replying ----------------------------------------------------------------------

    def _post(self, base: str, msg_id: str, body: str) -> tuple[int, dict[str, Any]]:
        now = datetime.now(UTC)
        headers = [
            ("content-type", "application/json"),
            ("webhook-id", msg_id),
            ("webhook-timestamp", str(int(now.timestamp()))),
            ("webhook-signature", self.webhook.sign(msg_id, now, body)),
        ]
        response = self._http.request(
            "POST",
            f"{base}/v1/webhooks/{self.endpoint}/replies",
            headers=headers,
            content=body.encode(),
            extensions={"timeout": {"connect": 2, "read": 10, "write": 5, "pool": 10}},
        )
        try:
            data = json.loads(response.content) if response.content else {}
        except ValueError:
            data = {}
        return response.status, data if isinstance(data, dict) else {}

    def _answer(self, rid: str, reply: Reply) -> None:
        """Send one reply until the API gives a final answer (200, 409, or a 4xx that is a bug)."""
        body = json.dumps({"request_id": rid, **reply, "decided_by": self.decided_by})
        msg_id = f"msg_reply_{rid}"
        deadline = time.monotonic() + self.give_up_after_s
        delay, tries = 0.05, 0
        while True:
            tries += 1
            with self._lock:
                base = self.api_urls[self._next_api % len(self.api_urls)]
                self._next_api += 1
            sent_at = time.time()
            try:
                status, data = self._post(base, msg_id, body)
            except (
                httpcore.NetworkError,
                httpcore.TimeoutException,
                httpcore.RemoteProtocolError,  # an API killed after the step, before its answer
                OSError,
            ) as exc:
                status, data = 0, {"error": type(exc).__name__}
            if status == 200:
                final = str(data.get("status"))
                self._done(Answered(rid, reply["outcome"], 200, final, tries, sent_at))
                return
            if status == 409:
                current = data.get("request") or {}
                if data.get("error") == "replayed" and current.get("status") == "pending":
                    # our id was marked as seen but the decision never landed (the API died
                    # in between): send it again as a new message
                    with self._lock:
                        self.counts["replayed_but_pending"] += 1
                    msg_id = f"msg_reply_{rid}_{tries}"
                else:
                    final = str(current.get("status"))
                    self._done(Answered(rid, reply["outcome"], 409, final, tries, sent_at))
                    return
            elif 400 <= status < 500 and status not in (408, 429):
                with self._lock:
                    self.failures.append(f"{rid}: HTTP {status} {data}")
                return
            with self._lock:
                self.counts["reply_retries"] += 1
            if time.monotonic() > deadline:
                with self._lock:
                    self.failures.append(f"{rid}: gave up after {tries} tries (last {status})")
                return
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _done(self, answered: Answered) -> None:
        with self._lock:
            self.answered[answered.request_id] = answered
            self.counts[f"reply_{answered.status}"] += 1

    # ---- reading -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self.counts,
                "requests": len(self.requested_at),
                "answered": len(self.answered),
                "failures": len(self.failures),
            }

    def times(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {
                "requested": dict(self.requested_at),
                "answered": {rid: a.at for rid, a in self.answered.items()},
            }


def parse_mix(text: str) -> dict[str, float]:
    mix: dict[str, float] = {}
    for part in text.split(","):
        action, _, share = part.partition("=")
        if action not in ("approve", "reject", "ignore"):
            raise SystemExit(f"--mix: unknown action {action!r} (approve, reject, ignore)")
        mix[action] = float(share or 1)
    return mix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secret", required=True)
    parser.add_argument("--api", action="append", required=True, help="API base URL (repeat)")
    parser.add_argument("--endpoint", default="bench", help="the [webhooks.NAME] it replies as")
    parser.add_argument("--mix", default="approve=1", help="e.g. approve=5,reject=3,ignore=2")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    receiver = DecidingReceiver(
        args.secret,
        args.api,
        endpoint=args.endpoint,
        policy=mix_policy(parse_mix(args.mix)),
        threads=args.threads,
        port=args.port,
    ).start()
    print(f"listening on {receiver.url('')}", flush=True)
    serve_until_stopped(receiver)


if __name__ == "__main__":
    main()
