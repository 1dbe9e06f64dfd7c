"""Slack's contract kit: the fake Slack Web API (tests/support/fakes/slack.py) the notifier
posts to and edits (`chat.postMessage`, `chat.update`), and block_actions interactions signed
as Slack signs them (v0, slack_sdk's SignatureVerifier) to `POST /v1/slack/interactions`.

Forged: signed with another secret. Stale: signed ten minutes ago (Slack's window is five).
A stranger: a Slack user no approver has."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from httpx import Response

from channels.slack import action_ids as ids
from tests.support.channel_kit import ALICE, BOB, FORGED, STALE, STRANGER, ChannelKit, Reply, World
from tests.support.fakes.slack import FakeSlack, request_id_of
from tests.support.notifier_setup import slack_section
from tests.support.slack_api import SIGNING_SECRET, click, signed

USERS = {ALICE: "U_ALICE", BOB: "U_BOB", STRANGER: "U_STRANGER"}
CHANNEL = "C1"  # slack_section's ids of `slack:approvals` and `slack:money`
OTHER = "C2"


class Kit(ChannelKit):
    kind = "slack"
    channels = ("slack:approvals", "slack:money")
    keeps_copies = True

    def __init__(self) -> None:
        self.fake = FakeSlack()

    @contextmanager
    def running(self) -> Iterator[None]:
        self.fake.start()
        try:
            yield
        finally:
            self.fake.stop()

    def sections(self) -> dict[str, Any]:
        section = slack_section(
            self.fake, signing_secret=SIGNING_SECRET, channels=("approvals", "money")
        )
        return {"slack": section}

    def identity(self, person: str) -> dict[str, Any]:
        return {"slack_user_id": USERS[person]}

    def places(self) -> list[str]:
        return [CHANNEL, OTHER]

    def posts(self, request_id: str) -> list[str]:
        return [str(post["channel"]) for post in self.fake.posts_for(request_id)]

    def copies(self, request_id: str) -> list[str]:
        messages = list(self.fake.messages.values())
        return [
            json.dumps(m, ensure_ascii=False) for m in messages if request_id_of(m) == request_id
        ]

    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        payload = click(ids.APPROVE, request_id, user=USERS[person], channel=CHANNEL)
        secret = "a-secret-that-is-not-the-apps-0000" if how == FORGED else SIGNING_SECRET
        body, headers = signed(payload, age_s=600 if how == STALE else 0, secret=secret)
        return Reply("/v1/slack/interactions", body, headers)

    def accepted(self, response: Response) -> bool:
        return response.status_code == 200 and response.json().get("status") == "approved"

    def refused(self, response: Response, how: str, person: str) -> bool:
        if person == STRANGER:
            return response.status_code == 200 and "is not an approver" in response.json()["text"]
        return response.status_code == 401 and response.json()["error"] == "bad_signature"
