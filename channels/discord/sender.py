"""Discord: one card per request and channel, a message with button components posted with
the REST API (`POST /channels/{id}/messages`, `Authorization: Bot TOKEN`) and edited in place
(`PATCH /channels/{id}/messages/{message id}`) as the request moves (`channels.cards.sender`,
`channels.copies`). Each button's `custom_id` is a `channels.cards.button_tokens` token.

Discord reads markdown in `content`: requester text has its markdown characters escaped, and
`allowed_mentions` is empty, so a prompt saying `@everyone` pings no one.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from broker.domain.models import Request
from broker.facade import PostState
from channels import platform_http
from channels.cards.render import Card, render
from channels.cards.sender import CardSender
from channels.discord.config import DiscordConfig
from channels.wording import clip

MAX_CONTENT = 1990  # a message's content may hold 2000 characters
STYLES = {"primary": 1, "secondary": 2, "danger": 4}
_MARKDOWN = re.compile(r"([\\*_~`|>#\[\]()@<])")


def escape(text: str) -> str:
    """Discord markdown (and mention) characters shown as written."""
    return _MARKDOWN.sub(r"\\\1", text)


def discord_client(config: DiscordConfig, timeout_s: float) -> httpx.Client:
    return httpx.Client(
        base_url=config.api_base_url.rstrip("/") + "/",
        headers={"Authorization": f"Bot {config.bot_token}"},
        timeout=timeout_s,
    )


def components(card: Card) -> list[dict[str, Any]]:
    """The card's buttons as action rows (type 1) of buttons (type 2)."""
    return [
        {
            "type": 1,
            "components": [
                {
                    "type": 2,
                    "style": STYLES.get(b.style, 2),
                    "label": clip(b.label, 80),
                    "custom_id": b.token,
                }
                for b in row
            ],
        }
        for row in card.rows[:5]
    ]


def message_body(card: Card) -> dict[str, Any]:
    return {
        "content": clip(card.text, MAX_CONTENT),
        "components": components(card),
        "allowed_mentions": {"parse": []},
    }


def _retry_after(response: httpx.Response, data: dict[str, Any]) -> float | None:
    value = data.get("retry_after")
    if isinstance(value, int | float):
        return float(value)
    return platform_http.header_retry_after(response)


def _describe(data: dict[str, Any]) -> str:
    return str(data.get("message") or "")[:300]


class DiscordSender(CardSender):
    kind = "discord"

    def __init__(self, name: str, channel_id: str, *, client: httpx.Client, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.channel_id = channel_id
        self.client = client

    def _render(self, request: Request) -> dict[str, Any]:
        return message_body(render(request, self.config, self.name, escape=escape))

    def post(self, request: Request) -> PostState:
        body = self._render(request)
        data = platform_http.call(
            self,
            "Discord",
            lambda: self.client.post(f"channels/{self.channel_id}/messages", json=body),
            _retry_after,
            _describe,
        )
        return PostState(channel=str(data.get("channel_id") or self.channel_id), ts=str(data["id"]))

    def update_copy(self, copy: PostState, request: Request, what: str) -> str:
        body = self._render(request)
        platform_http.call(
            self,
            "Discord",
            lambda: self.client.patch(f"channels/{copy.channel}/messages/{copy.ts}", json=body),
            _retry_after,
            _describe,
        )
        return f"{what}: edited {copy.ts}"

    def close(self) -> None:
        self.client.close()
