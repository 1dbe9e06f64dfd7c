"""Telegram's contract kit: the fake Bot API (tests/support/fakes/telegram.py) the notifier
posts cards to and edits (`sendMessage`, `editMessageText`), and the updates Telegram would send
the bot's webhook (`POST /v1/telegram/updates`) for a button pressed under a card.

Forged: another secret token. Stale: an update whose `update_id` was handled already (Telegram
redelivers an update until it hears 200): bob's press carrying the id of alice's, after hers
counted. A stranger: a Telegram user no approver has."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from httpx import Response

from channels.cards import button_tokens as ids
from tests.support.channel_kit import (
    ALICE,
    BOB,
    FORGED,
    STALE,
    STRANGER,
    ChannelKit,
    Reply,
    World,
)
from tests.support.chat_setup import (
    ALICE_TG,
    BOB_TG,
    EVE_TG,
    TG_CHAT,
    TG_OTHER_CHAT,
    TG_SECRET,
    telegram_section,
)
from tests.support.fakes.telegram import FakeTelegram, dumps

USERS = {ALICE: ALICE_TG, BOB: BOB_TG, STRANGER: EVE_TG}


class Kit(ChannelKit):
    kind = "telegram"
    channels = ("telegram:ops", "telegram:money")
    keeps_copies = True

    def __init__(self) -> None:
        self.fake = FakeTelegram()

    @contextmanager
    def running(self) -> Iterator[None]:
        self.fake.start()
        try:
            yield
        finally:
            self.fake.stop()

    def sections(self) -> dict[str, Any]:
        return {"telegram": telegram_section(self.fake, ops=TG_CHAT, money=TG_OTHER_CHAT)}

    def identity(self, person: str) -> dict[str, Any]:
        return {"telegram_user_id": USERS[person]}

    def places(self) -> list[str]:
        return [str(TG_CHAT), str(TG_OTHER_CHAT)]

    def posts(self, request_id: str) -> list[str]:
        sent = self.fake.calls_to("sendMessage", ok_only=True)
        return [str(c.params["chat_id"]) for c in sent if request_id in c.params["text"]]

    def copies(self, request_id: str) -> list[str]:
        return [card["text"] for card in self.fake.cards_for(request_id)]

    def update(self, request_id: str, person: str) -> dict[str, Any]:
        """The update for `person` pressing Approve under the request's card in `ops`."""
        [card] = [c for c in self.fake.cards_for(request_id) if c["chat"]["id"] == TG_CHAT]
        return self.fake.click(card, USERS[person], ids.token(ids.APPROVE, request_id))

    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        update = self.update(request_id, person)
        if how == STALE:
            first = self.update(request_id, ALICE)
            assert world.send(sent(first)).json()["text"] == "Your vote is counted."
            update["update_id"] = first["update_id"]
        return sent(update, "not-the-webhook-secret-0123456789" if how == FORGED else TG_SECRET)

    def accepted(self, response: Response) -> bool:
        answer = response.json()
        return answer.get("method") == "answerCallbackQuery" and answer["text"].startswith("Done")

    def refused(self, response: Response, how: str, person: str) -> bool:
        if how == FORGED:
            return response.status_code == 401 and response.json()["error"] == "bad_secret"
        if how == STALE:
            return response.status_code == 200 and response.json() == {}  # handled before
        return response.status_code == 200 and "is not an approver" in response.json()["text"]


def sent(update: dict[str, Any], secret: str = TG_SECRET) -> Reply:
    """The update as Telegram POSTs it to the bot's webhook."""
    headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": secret}
    return Reply("/v1/telegram/updates", dumps(update), headers)
