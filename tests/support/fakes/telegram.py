"""A fake Telegram Bot API on loopback: sendMessage, editMessageText, answerCallbackQuery.

Point `[telegram] api_base_url` at `fake.url`. It checks what Telegram checks: the bot token in
the path (`/bot{token}/{method}`, else 401), a JSON body, a chat id, a text of 1 to 4096
characters, inline keyboards whose buttons each have a text and 1 to 64 bytes of
`callback_data`, and an edit that changes nothing ("message is not modified", 400). Failures
are programmable per method (`fail("sendMessage", 429, retry_after=1)`: the Bot API's
`parameters.retry_after`). Every call is recorded (`calls`), and every message as it stands
(`messages`, by (chat id, message id)); `update(...)` builds the updates Telegram would send.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from tests.support.fakes._http import QuietHandler, ServerThread


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    status: int
    response: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class _Handler(QuietHandler):
    def do_POST(self) -> None:
        fake: FakeTelegram = self.server.owner  # type: ignore[attr-defined]
        _, _, rest = self.path.partition("/bot")
        token, _, method = rest.partition("/")
        raw = self.read_body()
        if "application/json" not in (self.headers.get("content-type") or ""):
            self.reply(400, {"ok": False, "error_code": 400, "description": "expected JSON"})
            return
        status, body = fake.handle(token, method, json.loads(raw or b"{}"))
        self.reply(status, body)


def bad(status: int, description: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    return status, {"ok": False, "error_code": status, "description": description, **extra}


def keyboard_problem(markup: Any) -> str | None:
    """What Telegram would refuse in a reply_markup, or None."""
    if markup is None:
        return None
    if not isinstance(markup, dict):
        return "reply_markup must be an object"
    if "force_reply" in markup:
        return None if markup["force_reply"] is True else "force_reply must be true"
    rows = markup.get("inline_keyboard")
    if not isinstance(rows, list):
        return "can't parse inline keyboard"
    for row in rows:
        for button in row:
            data = button.get("callback_data")
            if not button.get("text"):
                return "inline keyboard button text is empty"
            if not isinstance(data, str) or not 1 <= len(data.encode()) <= 64:
                return "BUTTON_DATA_INVALID"
    return None


class FakeTelegram:
    def __init__(self, token: str = "123456:TEST-telegram-token") -> None:
        self.token = token
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, int], dict[str, Any]] = {}
        self._failures: dict[str, deque[tuple[int, float | None]]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._ids = itertools.count(100)
        self._updates = itertools.count(1)
        self._server = ServerThread(_Handler, self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}"

    def start(self) -> FakeTelegram:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def fail(self, method: str, status: int = 500, *, retry_after: float | None = None) -> None:
        """Answer the next call of `method` with this failure."""
        with self._lock:
            self._failures[method].append((status, retry_after))

    # ---- what happened -----------------------------------------------------------------

    def calls_to(self, method: str, *, ok_only: bool = False) -> list[Call]:
        with self._lock:
            return [
                c for c in self.calls if c.method == method and (not ok_only or c.response["ok"])
            ]

    def calls_from(self, start: int) -> list[Call]:
        """Every call from the `start`-th on, in order (a watcher reads only what is new)."""
        with self._lock:
            return self.calls[start:]

    def cards_for(self, request_id: str) -> list[dict[str, Any]]:
        """The messages (as they stand) whose text names the request."""
        with self._lock:
            return [m for m in self.messages.values() if request_id in m.get("text", "")]

    # ---- updates Telegram would send -----------------------------------------------------

    def click(self, message: dict[str, Any], user_id: int, data: str) -> dict[str, Any]:
        """The update for user `user_id` pressing the button `data` under `message`."""
        return {
            "update_id": next(self._updates),
            "callback_query": {
                "id": f"cq{next(self._updates)}",
                "from": {"id": user_id, "is_bot": False, "first_name": "U"},
                "message": message,
                "chat_instance": "1",
                "data": data,
            },
        }

    def reply(self, to: dict[str, Any], user_id: int, text: str) -> dict[str, Any]:
        """The update for user `user_id` replying `text` to the bot's message `to`."""
        return {
            "update_id": next(self._updates),
            "message": {
                "message_id": next(self._ids),
                "from": {"id": user_id, "is_bot": False, "first_name": "U"},
                "chat": to["chat"],
                "date": int(time.time()),
                "text": text,
                "reply_to_message": to,
            },
        }

    # ---- the API -----------------------------------------------------------------------

    def handle(self, token: str, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            status, body = self._answer(token, method, params)
            self.calls.append(Call(method, params, status, body))
        return status, body

    def _answer(
        self, token: str, method: str, params: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        if token != self.token:
            return bad(401, "Unauthorized")
        if self._failures[method]:
            status, retry_after = self._failures[method].popleft()
            if status == 429:
                wait = int(retry_after or 1)
                return bad(
                    429, f"Too Many Requests: retry after {wait}", parameters={"retry_after": wait}
                )
            return bad(status, "Bad Gateway" if status >= 500 else "Bad Request")
        if method == "sendMessage":
            return self._send(params)
        if method == "editMessageText":
            return self._edit(params)
        if method == "answerCallbackQuery":
            return (
                (200, {"ok": True, "result": True})
                if params.get("callback_query_id")
                else bad(400, "Bad Request: query_id_invalid")
            )
        return bad(404, "Not Found: method not found")

    def _text_problem(self, params: dict[str, Any]) -> str | None:
        text = params.get("text")
        if not isinstance(text, str) or not 1 <= len(text) <= 4096:
            return "Bad Request: message text is empty or too long"
        problem = keyboard_problem(params.get("reply_markup"))
        return f"Bad Request: {problem}" if problem else None

    def _send(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if params.get("chat_id") in (None, ""):
            return bad(400, "Bad Request: chat not found")
        problem = self._text_problem(params)
        if problem:
            return bad(400, problem)
        chat = str(params["chat_id"])
        message = {
            "message_id": next(self._ids),
            "chat": {"id": int(chat) if chat.lstrip("-").isdigit() else chat, "type": "group"},
            "from": {"id": 1, "is_bot": True, "first_name": "Approvals"},
            "date": int(time.time()),
            "text": params["text"],
            "reply_markup": params.get("reply_markup") or {},
        }
        self.messages[(chat, message["message_id"])] = message
        return 200, {"ok": True, "result": message}

    def _edit(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        key = (str(params.get("chat_id")), int(params.get("message_id") or 0))
        if key not in self.messages:
            return bad(400, "Bad Request: message to edit not found")
        problem = self._text_problem(params)
        if problem:
            return bad(400, problem)
        message = self.messages[key]
        markup = params.get("reply_markup") or {}
        if message["text"] == params["text"] and message["reply_markup"] == markup:
            return bad(400, "Bad Request: message is not modified")
        message.update(text=params["text"], reply_markup=markup, edit_date=int(time.time()))
        return 200, {"ok": True, "result": message}


def buttons(message: dict[str, Any]) -> list[str]:
    """The callback data of a message's inline buttons, in order."""
    rows = (message.get("reply_markup") or {}).get("inline_keyboard") or []
    return [b["callback_data"] for row in rows for b in row]


def dumps(update: dict[str, Any]) -> bytes:
    return json.dumps(update).encode()
