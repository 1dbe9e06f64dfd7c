"""A fake Slack Web API on loopback: chat.postMessage, chat.update, views.open, auth.test.

Point `SlackConfig.api_base_url` at `fake.url`. Failures are programmable per method
(`fail("chat.postMessage", 429, retry_after=1)`; status 0 drops the connection unanswered;
`after_posting=True` does the call first, as a Slack that posted and then failed), calls can be
slowed (`delay`) or held until released (`hold()` / `release()`). Every call is recorded when
it arrives (`arrivals`) and when answered (`calls`), with the messages, for assertions.
views.open checks what Slack checks before it opens a modal (a trigger_id, a modal view with at
most 100 blocks and unique block ids) and keeps each view opened in `views`.
conversations.history finds posted messages by channel and time, with their metadata, unless
`history_allowed` is off (then it answers missing_scope).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from tests.support.fakes._http import QuietHandler, ServerThread


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    status: int
    response: dict[str, Any] | str
    at: float = field(default_factory=time.monotonic)


@dataclass
class Failure:
    status: int  # 0: drop the connection without an answer
    error: str
    retry_after: float | None = None
    after_posting: bool = False  # do the call, then fail (the outcome is lost to the caller)


def request_id_of(params: dict[str, Any]) -> str | None:
    """The request a message is about, from its metadata (as the notifier posts it)."""
    metadata = params.get("metadata")
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    if isinstance(metadata, dict):
        return (metadata.get("event_payload") or {}).get("request_id")
    return None


class _Handler(QuietHandler):
    def do_POST(self) -> None:
        fake: FakeSlack = self.server.owner  # type: ignore[attr-defined]
        method = self.path.rstrip("/").rsplit("/", 1)[-1]
        raw = self.read_body()
        if "json" in (self.headers.get("content-type") or ""):
            params = json.loads(raw or b"{}")
        else:
            params = dict(parse_qsl(raw.decode()))
        status, body, headers = fake.handle(method, params, self.headers.get("authorization"))
        if status == 0:  # a connection reset after the request went out
            self.close_connection = True
            return
        self.reply(status, body, headers)


class FakeSlack:
    def __init__(self, token: str = "xoxb-test-token") -> None:
        self.token = token
        self.calls: list[Call] = []
        self.arrivals: list[tuple[str, dict[str, Any]]] = []
        self.history_allowed = True
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.views: list[dict[str, Any]] = []
        self.delay: dict[str, float] = defaultdict(float)
        self._failures: dict[str, deque[Failure]] = defaultdict(deque)
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._ts = itertools.count(1)
        self._server = ServerThread(_Handler, self)

    # ---- control -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/api/"

    def start(self) -> FakeSlack:
        self._server.start()
        return self

    def stop(self) -> None:
        self.release()
        self._server.stop()

    def fail(
        self,
        method: str,
        status: int = 500,
        *,
        times: int = 1,
        error: str = "internal_error",
        retry_after: float | None = None,
        after_posting: bool = False,
    ) -> None:
        """Answer the next `times` calls of `method` with this failure."""
        with self._lock:
            for _ in range(times):
                self._failures[method].append(Failure(status, error, retry_after, after_posting))

    def hold(self) -> None:
        """Make every call wait until `release()` (a Slack that hangs)."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    # ---- what happened -----------------------------------------------------------------

    def arrived(self, method: str) -> int:
        """Calls of `method` that reached the fake, answered or not (held ones too)."""
        with self._lock:
            return sum(1 for m, _ in self.arrivals if m == method)

    def calls_to(self, method: str, *, ok_only: bool = False) -> list[Call]:
        with self._lock:
            return [
                c
                for c in self.calls
                if c.method == method
                and (not ok_only or (isinstance(c.response, dict) and c.response.get("ok")))
            ]

    def posts_for(self, request_id: str) -> list[dict[str, Any]]:
        """Messages successfully posted about one request, as posted (with their `ts`)."""
        return [
            {**c.params, "ts": c.response["ts"]}
            for c in self.calls_to("chat.postMessage", ok_only=True)
            if isinstance(c.response, dict)
            and c.response.get("ok")
            and request_id_of(c.params) == request_id
        ]

    def message_for(self, request_id: str) -> dict[str, Any] | None:
        """The current state of the message about one request (after any updates)."""
        with self._lock:
            for message in self.messages.values():
                if request_id_of(message) == request_id:
                    return message
        return None

    # ---- the API -----------------------------------------------------------------------

    def handle(
        self, method: str, params: dict[str, Any], auth: str | None
    ) -> tuple[int, dict[str, Any] | str, dict[str, str]]:
        with self._lock:
            self.arrivals.append((method, params))
        self._open.wait(timeout=60)
        if self.delay[method]:
            time.sleep(self.delay[method])  # simulated server latency, not synchronisation
        with self._lock:
            failure = self._failures[method].popleft() if self._failures[method] else None
            status, body, headers = self._answer(method, params, auth, failure)
            self.calls.append(Call(method, params, status, body))
        return status, body, headers

    def _answer(
        self, method: str, params: dict[str, Any], auth: str | None, failure: Failure | None
    ) -> tuple[int, dict[str, Any] | str, dict[str, str]]:
        if failure is not None and failure.after_posting:
            self._answer(method, params, auth, None)
        if failure is not None:
            if failure.status == 0:
                return 0, "", {}
            headers = {}
            if failure.retry_after is not None:
                headers["Retry-After"] = str(int(failure.retry_after))
            if failure.status >= 500:
                return failure.status, "upstream trouble", headers
            return failure.status, {"ok": False, "error": failure.error}, headers
        if auth != f"Bearer {self.token}":
            return 200, {"ok": False, "error": "invalid_auth"}, {}
        if method == "auth.test":
            return 200, {"ok": True, "user_id": "UBOT", "team_id": "T1"}, {}
        if method == "chat.postMessage":
            channel = str(params.get("channel", ""))
            if not channel:
                return 200, {"ok": False, "error": "channel_not_found"}, {}
            ts = f"{int(time.time())}.{next(self._ts):06d}"
            message = {**params, "channel": channel, "ts": ts}
            self.messages[(channel, ts)] = message
            return 200, {"ok": True, "channel": channel, "ts": ts, "message": message}, {}
        if method == "chat.update":
            key = (str(params.get("channel")), str(params.get("ts")))
            if key not in self.messages:
                return 200, {"ok": False, "error": "message_not_found"}, {}
            self.messages[key] = {**self.messages[key], **params}
            return 200, {"ok": True, "channel": key[0], "ts": key[1]}, {}
        if method == "conversations.history":
            if not self.history_allowed:
                return 200, {"ok": False, "error": "missing_scope"}, {}
            channel, oldest = str(params.get("channel")), float(params.get("oldest") or 0)
            found = [
                m for (c, ts), m in self.messages.items() if c == channel and float(ts) > oldest
            ]
            found.sort(key=lambda m: float(m["ts"]), reverse=True)
            limit = int(params.get("limit") or 100)
            body = {"ok": True, "messages": found[:limit], "has_more": len(found) > limit}
            return 200, {**body, "response_metadata": {"next_cursor": ""}}, {}
        if method == "views.open":
            return 200, self._open_view(params), {}
        return 200, {"ok": False, "error": "unknown_method"}, {}

    def _open_view(self, params: dict[str, Any]) -> dict[str, Any]:
        view = params.get("view")
        if isinstance(view, str):
            view = json.loads(view)
        if not params.get("trigger_id"):
            return {"ok": False, "error": "invalid_trigger_id"}
        if not isinstance(view, dict) or view.get("type") != "modal":
            return {"ok": False, "error": "invalid_arguments"}
        blocks = view.get("blocks") or []
        block_ids = [b["block_id"] for b in blocks if "block_id" in b]
        if len(blocks) > 100 or len(set(block_ids)) != len(block_ids):
            return {"ok": False, "error": "invalid_arguments"}
        view = {"id": f"V{len(self.views) + 1}", **view, "trigger_id": params["trigger_id"]}
        self.views.append(view)
        return {"ok": True, "view": view}
