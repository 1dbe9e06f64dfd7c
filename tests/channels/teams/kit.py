"""Microsoft Teams' contract kit: the fake Bot Connector (tests/support/fakes/teams.py) the
notifier posts Adaptive Cards to and updates (POST, PUT), and the `adaptiveCard/action` invokes
Teams sends `POST /v1/teams/messages` for a click on a card.

The bot runs in the Agents SDK's anonymous mode, as the other Teams tests do: checking a Bot
Framework token's signature needs the Bot Framework's keys, fetched from Microsoft. Forged: an
invoke with a token signed by a key of our own (a token sent is checked even in anonymous mode,
and refused). Stale: an invoke whose activity id was handled already: bob's click carrying the
id of alice's, after hers counted. A stranger: an Entra ID user no approver has."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from httpx import Response

from tests.support.channel_kit import ALICE, BOB, FORGED, STALE, STRANGER, ChannelKit, Reply, World
from tests.support.fakes.teams import FakeConnector
from tests.support.teams_setup import ALICE as ALICE_AAD
from tests.support.teams_setup import APP_ID, CONVERSATION, MALLORY, TENANT, card_text, invoke
from tests.support.teams_setup import BOB as BOB_AAD

USERS = {ALICE: ALICE_AAD, BOB: BOB_AAD, STRANGER: MALLORY}
CARD = "application/vnd.microsoft.card.adaptive"
OTHER = "19:treasury-room@thread.tacv2"
NOT_BOT_FRAMEWORKS = rsa.generate_private_key(public_exponent=65537, key_size=2048)
FORGED_TOKEN = jwt.encode(
    {"aud": APP_ID, "iss": "https://api.botframework.com", "exp": 4_000_000_000},
    NOT_BOT_FRAMEWORKS,
    algorithm="RS256",
    headers={"kid": "not-a-bot-framework-key"},
)


class Kit(ChannelKit):
    kind = "teams"
    channels = ("teams:approvals", "teams:money")
    keeps_copies = True

    def __init__(self) -> None:
        self.connector = FakeConnector((CONVERSATION, OTHER))

    @contextmanager
    def running(self) -> Iterator[None]:
        self.connector.start()
        try:
            yield
        finally:
            self.connector.stop()

    def sections(self) -> dict[str, Any]:
        def channel(conversation: str) -> dict[str, str]:
            url = self.connector.url
            return {"service_url": url, "conversation_id": conversation, "tenant_id": TENANT}

        channels = {"approvals": channel(CONVERSATION), "money": channel(OTHER)}
        return {"teams": {"allow_anonymous": True, "channels": channels}}

    def identity(self, person: str) -> dict[str, Any]:
        return {"teams_user_id": USERS[person]}

    def places(self) -> list[str]:
        return [CONVERSATION, OTHER]

    def posts(self, request_id: str) -> list[str]:
        with self.connector.lock:
            calls = list(self.connector.calls)
        return [
            c.conversation
            for c in calls
            if c.method == "POST" and c.status == 201 and request_id in json.dumps(c.body)
        ]

    def copies(self, request_id: str) -> list[str]:
        return [json.dumps(card) for _, card in self.connector.cards_for(request_id)]

    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        headers = {"Content-Type": "application/json"}
        if how == FORGED:
            headers["Authorization"] = f"Bearer {FORGED_TOKEN}"
        activity_id = None
        if how == STALE:
            activity_id = f"f:{request_id}:alice"
            first = invoke(request_id, "approve", USERS[ALICE], activity_id=activity_id)
            voted = world.send(Reply("/v1/teams/messages", json.dumps(first).encode(), headers))
            assert "1 of 2 approvals" in card_text(voted.json()["value"]), voted.text
        activity = invoke(request_id, "approve", USERS[person], activity_id=activity_id)
        return Reply("/v1/teams/messages", json.dumps(activity).encode(), headers)

    def accepted(self, response: Response) -> bool:
        answer = response.json()
        return answer["type"] == CARD and "Approved by alice" in card_text(answer["value"])

    def refused(self, response: Response, how: str, person: str) -> bool:
        if how == FORGED:
            return response.status_code == 401 and response.json()["error"] == "unauthorized"
        shown = json.dumps(response.json().get("value"))
        if how == STALE:
            return "This click was already received." in shown
        return response.status_code == 200 and "is not an approver" in shown
