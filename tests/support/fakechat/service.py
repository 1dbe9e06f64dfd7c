"""The FakeChat service itself, on loopback: what the fakechat channel kind posts to, and what
signs the webhook a button press sends back.

Its API is made up and small, and it checks what a real chat service would: `Authorization:
Bearer <bot token>` (else 401), a room it knows (else 404), a JSON message of 1 to 4,000
characters of `text` with at most 10 `buttons`, each a `label` and an `id` of 1 to 64 bytes
(else 400), and an edit of a message that exists in that room (else 404):

- `POST /rooms/{room}/messages` -> 201 `{"id", "room"}`
- `PUT /rooms/{room}/messages/{id}` -> 200 `{"id", "room"}`

Every call is recorded (`calls`), and every message as it stands (`messages`). `press(...)`
gives the body and headers the service would POST to the broker's webhook when someone
presses a button, signed with Standard Webhooks (the `standardwebhooks` package) with the
service's secret; `secret`, `timestamp` and `msg_id` let a test forge, age or replay one.
"""

from __future__ import annotations

import base64
import itertools
import json
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from standardwebhooks.webhooks import Webhook

from tests.support.fakes._http import QuietHandler, ServerThread

MAX_TEXT = 4000
MAX_BUTTONS = 10


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass(frozen=True)
class Call:
    method: str
    room: str
    message: str | None
    body: Any
    status: int


def message_problem(body: Any) -> str | None:
    """What the service refuses in a message body, or None."""
    if not isinstance(body, dict):
        return "a message is a JSON object"
    text = body.get("text")
    if not isinstance(text, str) or not 1 <= len(text) <= MAX_TEXT:
        return f"text must be 1 to {MAX_TEXT} characters"
    buttons = body.get("buttons", [])
    if not isinstance(buttons, list) or len(buttons) > MAX_BUTTONS:
        return f"at most {MAX_BUTTONS} buttons"
    for button in buttons:
        if not isinstance(button, dict) or not button.get("label"):
            return "a button needs a label"
        if not isinstance(button.get("id"), str) or not 1 <= len(button["id"].encode()) <= 64:
            return "a button id is 1 to 64 bytes"
    return None


class _Handler(QuietHandler):
    def _serve(self, method: str) -> None:
        service: FakeChatService = self.server.owner  # type: ignore[attr-defined]
        parts = [unquote(p) for p in self.path.split("?", 1)[0].strip("/").split("/")]
        raw = self.read_body()
        if len(parts) not in (3, 4) or parts[0] != "rooms" or parts[2] != "messages":
            self.reply(404, {"error": "no such route"})
            return
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        message = parts[3] if len(parts) == 4 else None
        status, answer = service.handle(
            method, parts[1], message, body, self.headers.get("authorization")
        )
        self.reply(status, answer)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("POST")

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("PUT")


class FakeChatService:
    def __init__(self, rooms: tuple[str, ...] = ("ops",), token: str = "fc-bot-token") -> None:
        self.rooms = set(rooms)
        self.token = token
        self.secret = new_secret()
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._presses = itertools.count(1)
        self._server = ServerThread(_Handler, self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}"

    def start(self) -> FakeChatService:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    # ---- what happened -----------------------------------------------------------------

    def posted(self, request_id: str) -> list[Call]:
        """The successful posts of a message naming `request_id`."""
        with self._lock:
            return [
                c
                for c in self.calls
                if c.method == "POST" and c.status == 201 and request_id in c.body["text"]
            ]

    def messages_for(self, request_id: str) -> list[dict[str, Any]]:
        """The messages naming `request_id`, as they stand."""
        with self._lock:
            return [m for m in self.messages.values() if request_id in m["text"]]

    # ---- the webhook it sends ------------------------------------------------------------

    def press(
        self,
        message: dict[str, Any],
        user: str,
        button: str,
        *,
        reason: str | None = None,
        secret: str | None = None,
        timestamp: datetime | None = None,
        msg_id: str | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of the webhook for `user` pressing `button` under `message`."""
        payload: dict[str, Any] = {"room": message["room"], "user": user, "button": button}
        if reason is not None:
            payload["reason"] = reason
        body = json.dumps(payload)
        msg_id = msg_id or f"press_{next(self._presses)}"
        at = timestamp or datetime.now(UTC)
        signature = Webhook(secret or self.secret).sign(msg_id, at, body)
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signature,
            "content-type": "application/json",
        }
        return body.encode(), headers

    # ---- the API -----------------------------------------------------------------------

    def handle(
        self, method: str, room: str, message: str | None, body: Any, auth: str | None
    ) -> tuple[int, dict[str, Any]]:
        with self._lock:
            status, answer = self._answer(method, room, message, body, auth)
            self.calls.append(Call(method, room, message, body, status))
        return status, answer

    def _answer(
        self, method: str, room: str, message: str | None, body: Any, auth: str | None
    ) -> tuple[int, dict[str, Any]]:
        if auth != f"Bearer {self.token}":
            return 401, {"error": "bad token"}
        if room not in self.rooms:
            return 404, {"error": "no such room"}
        problem = message_problem(body)
        if problem:
            return 400, {"error": problem}
        if method == "POST" and message is None:
            new = str(next(self._ids))
            self.messages[(room, new)] = {"id": new, "room": room, **body}
            return 201, {"id": new, "room": room}
        if method == "PUT" and message is not None:
            if (room, message) not in self.messages:
                return 404, {"error": "no such message"}
            self.messages[(room, message)] = {"id": message, "room": room, **body}
            return 200, {"id": message, "room": room}
        return 405, {"error": "method not allowed"}
