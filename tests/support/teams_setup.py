"""What the Teams tests share: the people and the conversation, a config pointing at the fake
Bot Connector, and the `adaptiveCard/action` invokes Teams sends for a click on our card."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from broker.domain.config import Config, parse_config
from broker.domain.principals import hash_token
from tests.support.fakes.teams import FakeConnector

ADMIN = "admin-token-for-the-teams-tests-0123"
CONVERSATION = "19:approvals@thread.tacv2"
TENANT = "tenant-0001"
APP_ID = "11111111-2222-3333-4444-555555555555"
ALICE = "00000000-0000-0000-0000-00000000a11c"
BOB = "00000000-0000-0000-0000-000000000b0b"
MALLORY = "00000000-0000-0000-0000-0000000ba11e"
_ids = itertools.count(1)


@pytest.fixture(name="connector")
def fake_connector() -> Iterator[FakeConnector]:
    fake = FakeConnector((CONVERSATION,)).start()
    yield fake
    fake.stop()


def teams_config(fake: FakeConnector, **extra: Any) -> Config:
    """Anonymous mode (no app id): `default` and `two` (quorum 2) decided in the conversation."""
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox", "teams:approvals"], **extra},
                "two": {"channels": ["inbox", "teams:approvals"], "quorum": 2},
            },
            "teams": {
                "allow_anonymous": True,
                "channels": {
                    "approvals": {
                        "service_url": fake.url,
                        "conversation_id": CONVERSATION,
                        "tenant_id": TENANT,
                    }
                },
            },
            "approvers": {
                "alice": {
                    "roles": ["finance"],
                    "teams_user_id": ALICE,
                    "token_sha256": hash_token("tok-alice"),
                },
                "bob": {"roles": ["finance"], "teams_user_id": BOB},
            },
        }
    )


def app_id_config(fake: FakeConnector) -> Config:
    """With an app id: every activity needs a Bot Framework token (the SDK's validation)."""
    return parse_config(
        {
            "queues": {"default": {"channels": ["teams:approvals"]}},
            "teams": {
                "app_id": APP_ID,
                "app_password": "not-a-real-secret",
                "tenant_id": TENANT,
                "channels": {
                    "approvals": {"service_url": fake.url, "conversation_id": CONVERSATION}
                },
            },
            "approvers": {"alice": {"teams_user_id": ALICE}},
        }
    )


def invoke(
    request_id: str,
    verb: str,
    user: str = ALICE,
    *,
    conversation: str = CONVERSATION,
    activity_id: str | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    """An `adaptiveCard/action` invoke as Teams sends it for a click on our card."""
    return {
        "type": "invoke",
        "name": "adaptiveCard/action",
        "id": activity_id or f"f:{next(_ids)}",
        "channelId": "msteams",
        "serviceUrl": "http://127.0.0.1:9/",
        "from": {"id": f"29:{user}", "aadObjectId": user, "name": "Someone"},
        "recipient": {"id": "28:bot", "name": "approvals"},
        "conversation": {
            "id": f"{conversation};messageid=1",
            "conversationType": "channel",
            "tenantId": TENANT,
        },
        "channelData": {"tenant": {"id": TENANT}},
        "value": {
            "action": {
                "type": "Action.Execute",
                "verb": verb,
                "data": {"request_id": request_id, **inputs},
            },
            "trigger": "manual",
        },
    }


def card_text(card: dict[str, Any]) -> str:
    """Every text run of a card, one per line."""
    out = []
    for element in card["body"]:
        out += [run["text"] for run in element.get("inlines", [])]
    return "\n".join(out)
