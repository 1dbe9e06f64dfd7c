"""Telegram: one card per request and chat, sent with the Bot API's `sendMessage` (inline
keyboard buttons whose `callback_data` are `channels.cards.button_tokens` tokens) and edited in place with
`editMessageText` as the request moves (`channels.cards.sender`, `channels.copies`).

Plain text (no `parse_mode`), so requester text can't format or link anything; controls and
bidi characters are dropped (`channels.cards.render`). Calls are JSON POSTs to
`{api_base_url}/bot{token}/{method}` over httpx with a timeout; "message is not modified"
(the card already shows this state) counts as done.
"""

from __future__ import annotations

from typing import Any

import httpx

from broker.domain.models import Request
from broker.facade import PostState
from channels import platform_http
from channels.cards.render import Card, render
from channels.cards.sender import CardSender
from channels.retry import GiveUp
from channels.telegram.config import TelegramConfig
from channels.wording import clip

MAX_TEXT = 4000  # sendMessage allows 4096 (UTF-16 units, after entities): leave room
NOT_MODIFIED = "message is not modified"


def telegram_client(config: TelegramConfig, timeout_s: float) -> httpx.Client:
    """A client for one bot; the token is in the base URL, so the client is never logged."""
    base = config.api_base_url.rstrip("/")
    return httpx.Client(base_url=f"{base}/bot{config.bot_token}/", timeout=timeout_s)


def keyboard(card: Card) -> dict[str, Any]:
    """The card's buttons as an InlineKeyboardMarkup (an empty one removes them)."""
    return {
        "inline_keyboard": [
            [{"text": b.label, "callback_data": b.token} for b in row] for row in card.rows
        ]
    }


def _retry_after(response: httpx.Response, data: dict[str, Any]) -> float | None:
    params = data.get("parameters")
    value = params.get("retry_after") if isinstance(params, dict) else None
    if isinstance(value, int | float):
        return float(value)
    return platform_http.header_retry_after(response)


def _describe(data: dict[str, Any]) -> str:
    return str(data.get("description") or "")[:300]


class TelegramSender(CardSender):
    kind = "telegram"

    def __init__(self, name: str, chat_id: int | str, *, client: httpx.Client, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.chat_id = chat_id
        self.client = client

    def _call(self, method: str, payload: dict[str, Any]) -> dict[str, Any]:
        data = platform_http.call(
            self,
            "Telegram",
            lambda: self.client.post(method, json=payload),
            _retry_after,
            _describe,
        )
        if not data.get("ok"):
            raise GiveUp(f"Telegram refused {method}: {_describe(data)}")
        return data

    def post(self, request: Request) -> PostState:
        card = render(request, self.config, self.name)
        data = self._call(
            "sendMessage",
            {
                "chat_id": self.chat_id,
                "text": clip(card.text, MAX_TEXT),
                "reply_markup": keyboard(card),
                "link_preview_options": {"is_disabled": True},
            },
        )
        result = data.get("result") or {}
        chat = (result.get("chat") or {}).get("id", self.chat_id)
        return PostState(channel=str(chat), ts=str(result.get("message_id")))

    def update_copy(self, copy: PostState, request: Request, what: str) -> str:
        card = render(request, self.config, self.name)
        try:
            self._call(
                "editMessageText",
                {
                    "chat_id": copy.channel,
                    "message_id": int(copy.ts or 0),
                    "text": clip(card.text, MAX_TEXT),
                    "reply_markup": keyboard(card),
                    "link_preview_options": {"is_disabled": True},
                },
            )
        except GiveUp as exc:
            if NOT_MODIFIED not in str(exc):
                raise
        return f"{what}: edited {copy.ts}"

    def close(self) -> None:
        self.client.close()
