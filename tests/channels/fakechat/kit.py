"""FakeChat's contract kit (the worked example of docs/adding-a-channel.md): the FakeChat
service (tests/support/fakechat/service.py) the notifier posts to and edits, and button presses
the service signs with Standard Webhooks to `POST /v1/fakechat/events`.

Forged: signed with another secret. Stale: signed ten minutes ago (the window is five). A
stranger: a FakeChat user no approver has."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from httpx import Response

from channels.cards import button_tokens as ids
from tests.support.channel_kit import ALICE, BOB, FORGED, STALE, STRANGER, ChannelKit, Reply, World
from tests.support.fakechat.service import FakeChatService, new_secret

ROOM, OTHER = "room-1", "room-2"
USERS = {ALICE: "fc-alice", BOB: "fc-bob", STRANGER: "fc-mallory"}


class Kit(ChannelKit):
    kind = "fakechat"
    channels = ("fakechat:ops", "fakechat:money")
    keeps_copies = True

    def __init__(self) -> None:
        self.service = FakeChatService(rooms=(ROOM, OTHER))

    @contextmanager
    def running(self) -> Iterator[None]:
        self.service.start()
        try:
            yield
        finally:
            self.service.stop()

    def sections(self) -> dict[str, Any]:
        return {
            "fakechat": {
                "api_url": self.service.url,
                "bot_token": self.service.token,
                "signing_secret": self.service.secret,
                "rooms": {"ops": {"room": ROOM}, "money": {"room": OTHER}},
            }
        }

    def identity(self, person: str) -> dict[str, Any]:
        return {"fakechat_user_id": USERS[person]}

    def places(self) -> list[str]:
        return [ROOM, OTHER]

    def posts(self, request_id: str) -> list[str]:
        return [call.room for call in self.service.posted(request_id)]

    def copies(self, request_id: str) -> list[str]:
        return [message["text"] for message in self.service.messages_for(request_id)]

    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        [message] = [m for m in self.service.messages_for(request_id) if m["room"] == ROOM]
        approve = ids.token(ids.APPROVE, request_id)
        body, headers = self.service.press(
            message,
            USERS[person],
            approve,
            secret=new_secret() if how == FORGED else None,
            timestamp=datetime.now(UTC) - timedelta(minutes=10) if how == STALE else None,
        )
        return Reply("/v1/fakechat/events", body, headers)

    def accepted(self, response: Response) -> bool:
        return response.status_code == 200 and response.json()["result"] == "decided"

    def refused(self, response: Response, how: str, person: str) -> bool:
        if person == STRANGER:
            answer = response.json()
            return answer["result"] == "refused" and "is not an approver" in answer["text"]
        return response.status_code == 401 and response.json()["error"] == "bad_signature"
