"""Discord's contract kit: the fake Discord REST API (tests/support/fakes/discord.py) the
notifier posts cards to and edits, and button interactions signed with the fake application's
Ed25519 key, as Discord signs them, to `POST /v1/discord/interactions`.

Forged: signed with another key. Stale: signed ten minutes ago (the window is five). A
stranger: a Discord user no approver has."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from httpx import Response
from nacl.signing import SigningKey

from channels.cards import button_tokens as ids
from tests.support.channel_kit import ALICE, BOB, FORGED, STALE, STRANGER, ChannelKit, Reply, World
from tests.support.chat_setup import (
    ALICE_DC,
    BOB_DC,
    DC_CHANNEL,
    DC_OTHER_CHANNEL,
    EVE_DC,
    discord_section,
)
from tests.support.fakes.discord import FakeDiscord

USERS = {ALICE: ALICE_DC, BOB: BOB_DC, STRANGER: EVE_DC}
EPHEMERAL_MESSAGE = 4
DEFERRED_UPDATE = 6


class Kit(ChannelKit):
    kind = "discord"
    channels = ("discord:ops", "discord:money")
    keeps_copies = True

    def __init__(self) -> None:
        self.fake = FakeDiscord()

    @contextmanager
    def running(self) -> Iterator[None]:
        self.fake.start()
        try:
            yield
        finally:
            self.fake.stop()

    def sections(self) -> dict[str, Any]:
        return {"discord": discord_section(self.fake, ops=DC_CHANNEL, money=DC_OTHER_CHANNEL)}

    def identity(self, person: str) -> dict[str, Any]:
        return {"discord_user_id": USERS[person]}

    def places(self) -> list[str]:
        return [DC_CHANNEL, DC_OTHER_CHANNEL]

    def posts(self, request_id: str) -> list[str]:
        escaped = request_id.replace("_", "\\_")  # Discord markdown, as the card writes it
        created = self.fake.calls_to("create", ok_only=True)
        return [c.channel for c in created if escaped in c.params["content"]]

    def copies(self, request_id: str) -> list[str]:
        return [card["content"] for card in self.fake.cards_for(request_id)]

    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        [card] = [c for c in self.fake.cards_for(request_id) if c["channel_id"] == DC_CHANNEL]
        payload = self.fake.click(card, USERS[person], ids.token(ids.APPROVE, request_id))
        sign: dict[str, Any] = {}
        if how == FORGED:
            sign["key"] = SigningKey.generate()
        elif how == STALE:
            sign["timestamp"] = int(time.time()) - 600
        body, headers = self.fake.signed(payload, **sign)
        return Reply("/v1/discord/interactions", body, headers)

    def accepted(self, response: Response) -> bool:
        return response.status_code == 200 and response.json() == {"type": DEFERRED_UPDATE}

    def refused(self, response: Response, how: str, person: str) -> bool:
        if person == STRANGER:
            answer = response.json()
            return (
                answer["type"] == EPHEMERAL_MESSAGE
                and "is not an approver" in answer["data"]["content"]
            )
        code = "stale" if how == STALE else "bad_signature"
        return response.status_code == 401 and response.json()["error"] == code
