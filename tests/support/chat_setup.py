"""What the Telegram and Discord tests share: the fakes as fixtures, config sections pointing
at them, and signed calls to the broker's two endpoints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx import Response

from tests.support.fakes.discord import FakeDiscord
from tests.support.fakes.telegram import FakeTelegram, dumps

TG_SECRET = "telegram-webhook-secret-0123456789"
TG_CHAT = -1001234567890  # a supergroup's id
TG_OTHER_CHAT = -1009999999999
DC_CHANNEL = "1000000000000000001"
DC_OTHER_CHANNEL = "1000000000000000002"
ALICE_TG, BOB_TG, EVE_TG = 1111, 2222, 6666
ALICE_DC, BOB_DC, EVE_DC = "3000000000000000001", "3000000000000000002", "3000000000000000006"


@pytest.fixture(name="telegram")
def fake_telegram() -> Iterator[FakeTelegram]:
    fake = FakeTelegram().start()
    yield fake
    fake.stop()


@pytest.fixture(name="discord")
def fake_discord() -> Iterator[FakeDiscord]:
    fake = FakeDiscord().start()
    yield fake
    fake.stop()


def telegram_section(fake: FakeTelegram, **chats: int) -> dict[str, Any]:
    chats = chats or {"ops": TG_CHAT}
    return {
        "bot_token": fake.token,
        "webhook_secret": TG_SECRET,
        "api_base_url": fake.url,
        "chats": {name: {"chat_id": chat} for name, chat in chats.items()},
    }


def discord_section(fake: FakeDiscord, **channels: str) -> dict[str, Any]:
    channels = channels or {"ops": DC_CHANNEL}
    return {
        "application_id": fake.application_id,
        "public_key": fake.public_key,
        "bot_token": fake.token,
        "api_base_url": fake.url,
        "channels": {name: {"channel_id": cid} for name, cid in channels.items()},
    }


def people() -> dict[str, Any]:
    """alice and bob decide on every channel; carol only asks."""
    return {
        "alice": {
            "roles": ["finance"],
            "telegram_user_id": ALICE_TG,
            "discord_user_id": ALICE_DC,
            "slack_user_id": "U_ALICE",
        },
        "bob": {"roles": ["finance"], "telegram_user_id": BOB_TG, "discord_user_id": BOB_DC},
        "carol": {"roles": ["requester"]},
    }


def tg_post(client: TestClient, update: dict[str, Any], secret: str | None = TG_SECRET) -> Response:
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret
    return client.post("/v1/telegram/updates", content=dumps(update), headers=headers)


def dc_post(
    client: TestClient, fake: FakeDiscord, payload: dict[str, Any], **sign: Any
) -> Response:
    body, headers = fake.signed(payload, **sign)
    return client.post("/v1/discord/interactions", content=body, headers=headers)
