"""A fake Discord REST API on loopback (create and edit channel messages), and a signer of
interactions with a test Ed25519 key.

Point `[discord] api_base_url` at `fake.url` and `public_key` at `fake.public_key`. It checks
what Discord checks: `Authorization: Bot {token}` (else 401), a JSON body, content of at most
2000 characters, `allowed_mentions`, at most 5 action rows (type 1) of at most 5 buttons
(type 2) each with a label of at most 80 characters, a known style and a `custom_id` of 1 to
100 characters. Failures are programmable per route (`fail("create", 429, retry_after=1)`:
Discord's JSON `retry_after` and the Retry-After header). Calls and messages are recorded.
`signed(payload)` gives the body and headers Discord would send to the interactions endpoint.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from nacl.signing import SigningKey

from tests.support.fakes._http import QuietHandler, ServerThread

_MESSAGES = re.compile(r"^/api/v10/channels/(?P<channel>\d+)/messages(?:/(?P<message>\d+))?$")


@dataclass
class Call:
    route: str  # create | edit
    channel: str
    message: str | None
    params: dict[str, Any]
    status: int
    at: float = field(default_factory=time.monotonic)


class _Handler(QuietHandler):
    def _serve(self, verb: str) -> None:
        fake: FakeDiscord = self.server.owner  # type: ignore[attr-defined]
        raw = self.read_body()
        found = _MESSAGES.match(self.path)
        if found is None:
            self.reply(404, {"message": "404: Not Found", "code": 0})
            return
        if "application/json" not in (self.headers.get("content-type") or ""):
            self.reply(400, {"message": "expected JSON", "code": 50109})
            return
        status, body, headers = fake.handle(
            verb,
            found.group("channel"),
            found.group("message"),
            json.loads(raw or b"{}"),
            self.headers.get("authorization"),
        )
        self.reply(status, body, headers)

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")


def components_problem(rows: Any) -> str | None:
    """What Discord would refuse in a message's components, or None."""
    if not isinstance(rows, list) or len(rows) > 5:
        return "components: at most 5 action rows"
    for row in rows:
        if row.get("type") != 1 or not 1 <= len(row.get("components") or []) <= 5:
            return "components: an action row holds 1 to 5 buttons"
        for button in row["components"]:
            if button.get("type") != 2 or button.get("style") not in (1, 2, 3, 4):
                return "components: not a button"
            if not 1 <= len(button.get("label") or "") <= 80:
                return "components: label must be 1 to 80 characters"
            if not 1 <= len(button.get("custom_id") or "") <= 100:
                return "components: custom_id must be 1 to 100 characters"
    return None


class FakeDiscord:
    def __init__(self, token: str = "discord-test-bot-token") -> None:
        self.token = token
        self.key = SigningKey.generate()
        self.application_id = "900000000000000001"
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self._failures: dict[str, deque[tuple[int, float | None]]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._ids = itertools.count(1_100_000_000_000_000_000)
        self._interactions = itertools.count(1_200_000_000_000_000_000)
        self._server = ServerThread(_Handler, self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/api/v10"

    @property
    def public_key(self) -> str:
        return self.key.verify_key.encode().hex()

    def start(self) -> FakeDiscord:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def fail(self, route: str, status: int = 500, *, retry_after: float | None = None) -> None:
        """Answer the next `route` call (`create` or `edit`) with this failure."""
        with self._lock:
            self._failures[route].append((status, retry_after))

    # ---- what happened -----------------------------------------------------------------

    def calls_to(self, route: str, *, ok_only: bool = False) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.route == route and (not ok_only or c.status < 300)]

    def cards_for(self, request_id: str) -> list[dict[str, Any]]:
        """The messages (as they stand) whose content names the request (markdown-escaped)."""
        escaped = request_id.replace("_", "\\_").replace(".", ".")
        with self._lock:
            return [m for m in self.messages.values() if escaped in m.get("content", "")]

    # ---- interactions Discord would send -------------------------------------------------

    def signed(
        self,
        payload: dict[str, Any],
        *,
        timestamp: int | str | None = None,
        key: SigningKey | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of an interaction, signed as Discord signs them (a str
        `timestamp` is signed as given, however odd)."""
        body = json.dumps(payload).encode()
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        signature = (key or self.key).sign(stamp.encode() + body).signature.hex()
        headers = {
            "X-Signature-Ed25519": signature,
            "X-Signature-Timestamp": stamp,
            "Content-Type": "application/json",
        }
        return body, headers

    def click(self, message: dict[str, Any], user_id: str, custom_id: str) -> dict[str, Any]:
        """A button click (type 3) by `user_id` on `message`, in a server."""
        return {
            "id": str(next(self._interactions)),
            "application_id": self.application_id,
            "type": 3,
            "token": "interaction-token",
            "version": 1,
            "channel_id": message["channel_id"],
            "guild_id": "800000000000000001",
            "member": {"user": {"id": user_id, "username": "u"}, "roles": []},
            "message": message,
            "data": {"custom_id": custom_id, "component_type": 2},
        }

    def submit(
        self, message: dict[str, Any], user_id: str, custom_id: str, reason: str
    ) -> dict[str, Any]:
        """A modal submission (type 5) whose one text input `reason` holds `reason`."""
        return {
            "id": str(next(self._interactions)),
            "application_id": self.application_id,
            "type": 5,
            "token": "interaction-token",
            "version": 1,
            "channel_id": message["channel_id"],
            "member": {"user": {"id": user_id, "username": "u"}, "roles": []},
            "message": message,
            "data": {
                "custom_id": custom_id,
                "components": [
                    {"type": 1, "components": [{"type": 4, "custom_id": "reason", "value": reason}]}
                ],
            },
        }

    # ---- the API -----------------------------------------------------------------------

    def handle(
        self, verb: str, channel: str, message: str | None, params: dict[str, Any], auth: str | None
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        route = "create" if verb == "POST" and message is None else "edit"
        with self._lock:
            status, body, headers = self._answer(route, channel, message, params, auth)
            self.calls.append(Call(route, channel, message, params, status))
        return status, body, headers

    def _answer(
        self,
        route: str,
        channel: str,
        message: str | None,
        params: dict[str, Any],
        auth: str | None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if auth != f"Bot {self.token}":
            return 401, {"message": "401: Unauthorized", "code": 0}, {}
        if self._failures[route]:
            status, retry_after = self._failures[route].popleft()
            if status == 429:
                wait = float(retry_after or 1)
                body = {
                    "message": "You are being rate limited.",
                    "retry_after": wait,
                    "global": False,
                }
                return 429, body, {"Retry-After": str(int(wait))}
            return status, {"message": "upstream trouble", "code": 0}, {}
        content = params.get("content")
        if not isinstance(content, str) or not 1 <= len(content) <= 2000:
            return 400, {"message": "Invalid Form Body: content", "code": 50035}, {}
        problem = components_problem(params.get("components") or [])
        if problem:
            return 400, {"message": f"Invalid Form Body: {problem}", "code": 50035}, {}
        if route == "create":
            if "allowed_mentions" not in params:
                return (
                    400,
                    {"message": "the fake wants allowed_mentions on every post", "code": 0},
                    {},
                )
            mid = str(next(self._ids))
            stored = {"id": mid, "channel_id": channel, "type": 0, **params}
            self.messages[(channel, mid)] = stored
            return 200, stored, {}
        key = (channel, str(message))
        if key not in self.messages:
            return 404, {"message": "Unknown Message", "code": 10008}, {}
        self.messages[key].update(params, edited_timestamp=time.time())
        return 200, self.messages[key], {}


def custom_ids(message: dict[str, Any]) -> list[str]:
    return [b["custom_id"] for row in message.get("components") or [] for b in row["components"]]
