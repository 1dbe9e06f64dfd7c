"""A fake Bot Connector service (the Teams side of a bot) on loopback.

It serves what the notifier calls: `POST /v3/conversations/{id}/activities` (a new card) and
`PUT /v3/conversations/{id}/activities/{activityId}` (the card updated), and checks what the
real service refuses: a bearer token when one is required (`token`), a known conversation, a
`message` activity whose attachment is an Adaptive Card (version 1.4 or later when it has
`Action.Execute` actions, each with a verb and data naming the request), an update of an
activity that exists in that conversation and whose body carries its id. Failures are
programmable per method (`fail("POST", 429, retry_after=1)`). Every call is recorded.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from tests.support.fakes._http import QuietHandler, ServerThread

CARD = "application/vnd.microsoft.card.adaptive"


@dataclass
class Call:
    method: str
    conversation: str
    activity_id: str | None
    body: dict[str, Any]
    status: int
    at: float = field(default_factory=time.monotonic)


@dataclass
class Failure:
    status: int
    retry_after: float | None = None


def card_problem(body: dict[str, Any]) -> str | None:
    """What the Connector (and Teams' card renderer) would refuse in `body`, or None."""
    if body.get("type") != "message":
        return "activity type must be message"
    attachments = body.get("attachments") or []
    if len(attachments) != 1 or attachments[0].get("contentType") != CARD:
        return "expected one Adaptive Card attachment"
    card = attachments[0].get("content") or {}
    if card.get("type") != "AdaptiveCard" or not isinstance(card.get("body"), list):
        return "the attachment is no Adaptive Card"
    for action in card.get("actions") or []:
        if action.get("type") != "Action.Execute":
            return f"unexpected action {action.get('type')}"
        if tuple(int(p) for p in str(card.get("version", "0")).split(".")) < (1, 4):
            return "Action.Execute needs card version 1.4"
        if not action.get("verb") or not (action.get("data") or {}).get("request_id"):
            return "an action without a verb or a request id"
    return None


class _Handler(QuietHandler):
    def _route(self) -> tuple[str, str | None] | None:
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) < 4 or parts[0] != "v3" or parts[1] != "conversations":
            return None
        if parts[3] != "activities" or len(parts) > 5:
            return None
        return unquote(parts[2]), (unquote(parts[4]) if len(parts) == 5 else None)

    def _handle(self, method: str) -> None:
        fake: FakeConnector = self.server.owner  # type: ignore[attr-defined]
        raw = self.read_body()
        route = self._route()
        if route is None:
            self.reply(404, {"error": {"code": "NotFound"}})
            return
        conversation, activity_id = route
        status, answer, headers = fake.answer(
            method, conversation, activity_id, raw, self.headers.get("authorization")
        )
        self.reply(status, answer, headers)

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")


class FakeConnector:
    def __init__(self, conversations: tuple[str, ...], token: str | None = None) -> None:
        self.conversations = set(conversations)
        self.token = token
        self.calls: list[Call] = []
        self.activities: dict[tuple[str, str], dict[str, Any]] = {}
        self.failures: dict[str, list[Failure]] = {}
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = ServerThread(_Handler, self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/"

    def start(self) -> FakeConnector:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def fail(self, method: str, status: int, *, times: int = 1, retry_after: float | None = None):
        """The next `times` calls of `method` (POST or PUT) answer `status`."""
        with self.lock:
            self.failures.setdefault(method, []).extend(
                Failure(status, retry_after) for _ in range(times)
            )

    def answer(
        self,
        method: str,
        conversation: str,
        activity_id: str | None,
        raw: bytes,
        authorization: str | None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        try:
            body = json.loads(raw)
        except ValueError:
            return 400, {"error": {"code": "BadArgument", "message": "not JSON"}}, {}
        with self.lock:
            status, answer, headers = self._answer(
                method, conversation, activity_id, body, authorization
            )
            self.calls.append(Call(method, conversation, activity_id, body, status))
        return status, answer, headers

    def _answer(
        self,
        method: str,
        conversation: str,
        activity_id: str | None,
        body: dict[str, Any],
        authorization: str | None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if self.token is not None and authorization != f"Bearer {self.token}":
            return 401, {"message": "Authorization has been denied for this request."}, {}
        if conversation not in self.conversations:
            return 404, {"error": {"code": "ConversationNotFound"}}, {}
        pending = self.failures.get(method) or []
        if pending:
            failure = pending.pop(0)
            headers = {}
            if failure.retry_after is not None:
                headers["Retry-After"] = str(int(failure.retry_after))
            return failure.status, {"error": {"code": "Throttled"}}, headers
        problem = card_problem(body)
        if problem:
            return 400, {"error": {"code": "BadArgument", "message": problem}}, {}
        if method == "POST" and activity_id is None:
            new_id = f"1:{next(self._ids)}"
            self.activities[(conversation, new_id)] = body
            return 201, {"id": new_id}, {}
        if method == "PUT" and activity_id is not None:
            if (conversation, activity_id) not in self.activities:
                return 404, {"error": {"code": "ActivityNotFound"}}, {}
            if body.get("id") != activity_id:
                return 400, {"error": {"code": "BadArgument", "message": "id mismatch"}}, {}
            self.activities[(conversation, activity_id)] = body
            return 200, {"id": activity_id}, {}
        return 405, {"error": {"code": "MethodNotAllowed"}}, {}

    def cards_for(self, request_id: str) -> list[tuple[str, dict[str, Any]]]:
        """(activity id, card) of every card about `request_id` as it stands now."""
        with self.lock:
            found = []
            for (_, aid), body in self.activities.items():
                card = body["attachments"][0]["content"]
                if any(request_id in json.dumps(e) for e in card["body"][-1:]):
                    found.append((aid, card))
            return found

    def count(self, method: str, status: int | None = None) -> int:
        with self.lock:
            return sum(1 for c in self.calls if c.method == method and status in (None, c.status))
