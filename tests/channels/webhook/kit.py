"""Webhooks' contract kit: a Standard Webhooks receiver (tests/support/fakes/webhook_receiver.py,
verifying with the `standardwebhooks` package) the notifier POSTs events to, and replies signed
with an endpoint's secret to `POST /v1/webhooks/{name}/replies`.

An endpoint is sent events, not copies: `approval.voted`, `decided`, `escalated` and
`timed_out`, never an ack. `ops` decides; `audit` is notify-only (`decides = false`), so a reply
it signs is the stranger's: an endpoint the config names as no approver. Forged: signed with
another secret. Stale: signed ten minutes ago (the window is five)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from httpx import Response

from tests.support.channel_kit import (
    DECISION,
    ESCALATION,
    FORGED,
    STALE,
    STRANGER,
    TIMEOUT,
    VOTE,
    ChannelKit,
    Reply,
    World,
)
from tests.support.fakes.harness import OLD_SECRET, SECRET, WRONG_SECRET, webhook
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.webhooks import signed

AUDIT_SECRET = OLD_SECRET
_ids = itertools.count(1)


class Kit(ChannelKit):
    kind = "webhook"
    channels = ("webhook:ops", "webhook:audit")
    hears = {
        VOTE: "approval.voted",
        DECISION: "approval.decided",
        ESCALATION: "approval.escalated",
        TIMEOUT: "approval.timed_out",
    }

    def __init__(self) -> None:
        self.receiver = WebhookReceiver([SECRET, AUDIT_SECRET])

    @contextmanager
    def running(self) -> Iterator[None]:
        self.receiver.start()
        try:
            yield
        finally:
            self.receiver.stop()

    def sections(self) -> dict[str, Any]:
        audit = webhook(self.receiver.url("/audit"), AUDIT_SECRET, decides=False)
        return {"webhooks": {"ops": webhook(self.receiver.url("/ops")), "audit": audit}}

    def places(self) -> list[str]:
        return ["/ops", "/audit"]

    def about(self, request_id: str, path: str | None = None) -> list[Any]:
        return [d for d in self.receiver.accepted(path) if d.payload["data"]["id"] == request_id]

    def posts(self, request_id: str) -> list[str]:
        return [d.path for d in self.about(request_id) if d.payload["type"] == "approval.requested"]

    def heard(self, request_id: str) -> list[str]:
        return [d.payload["type"] for d in self.about(request_id, "/ops")]

    def reply(self, world: World, request_id: str, person: str, how: str) -> Reply:
        name, secret = ("audit", AUDIT_SECRET) if person == STRANGER else ("ops", SECRET)
        body = {"request_id": request_id, "outcome": "approved", "decided_by": person}
        raw, headers = signed(
            json.dumps(body).encode(),
            WRONG_SECRET if how == FORGED else secret,
            msg_id=f"msg_contract_{next(_ids)}",
            age_s=600 if how == STALE else 0,
        )
        return Reply(f"/v1/webhooks/{name}/replies", raw, headers)

    def accepted(self, response: Response) -> bool:
        return response.status_code == 200 and response.json()["status"] == "approved"

    def refused(self, response: Response, how: str, person: str) -> bool:
        if person == STRANGER:
            return response.status_code == 403 and "notify-only" in response.json()["detail"]
        return response.status_code == 401 and response.json()["error"] == "bad_signature"
