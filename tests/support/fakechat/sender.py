"""FakeChat's sender: one message with buttons per request and room, posted once and edited
in place as the request moves. `channels.cards.sender.CardSender` says when (claims, the copy
recorded, later events of the request reaching it wherever they happen); this says how, with
the card every chat without its own markup shows (`channels.cards.render`)."""

from __future__ import annotations

from typing import Any

import httpx

from broker.domain.models import Request
from broker.facade import PostState
from channels import platform_http
from channels.cards.render import Card, render
from channels.cards.sender import CardSender
from channels.wording import clip
from tests.support.fakechat.config import FakeChatConfig

MAX_TEXT = 4000


def fakechat_client(config: FakeChatConfig, timeout_s: float) -> httpx.Client:
    return httpx.Client(
        base_url=config.api_url.rstrip("/") + "/",
        headers={"Authorization": f"Bearer {config.bot_token}"},
        timeout=timeout_s,
    )


def message_body(card: Card) -> dict[str, Any]:
    buttons = [{"label": clip(b.label, 40), "id": b.token} for row in card.rows for b in row]
    return {"text": clip(card.text, MAX_TEXT), "buttons": buttons}


def _retry_after(response: httpx.Response, data: dict[str, Any]) -> float | None:
    return platform_http.header_retry_after(response)


def _describe(data: dict[str, Any]) -> str:
    return str(data.get("error") or "")[:300]


class FakeChatSender(CardSender):
    kind = "fakechat"

    def __init__(self, name: str, room: str, *, client: httpx.Client, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.room = room
        self.client = client

    def _body(self, request: Request) -> dict[str, Any]:
        return message_body(render(request, self.config, self.name))

    def post(self, request: Request) -> PostState:
        body = self._body(request)
        data = platform_http.call(
            self,
            "FakeChat",
            lambda: self.client.post(f"rooms/{self.room}/messages", json=body),
            _retry_after,
            _describe,
        )
        return PostState(channel=self.room, ts=str(data["id"]))

    def update_copy(self, copy: PostState, request: Request, what: str) -> str:
        body = self._body(request)
        platform_http.call(
            self,
            "FakeChat",
            lambda: self.client.put(f"rooms/{copy.channel}/messages/{copy.ts}", json=body),
            _retry_after,
            _describe,
        )
        return f"{what}: edited {copy.ts}"

    def close(self) -> None:
        self.client.close()
