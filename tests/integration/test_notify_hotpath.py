"""The delivery hot path's hand-written pieces give what the library code they replace gave:
signatures (standardwebhooks, over the body's bytes), the body's head (`json.dumps`), history
notes (pydantic), routes worked out once per kind of event."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from redis import Redis
from standardwebhooks import Webhook

from broker.domain.events import EVENT_TYPES, parse_entry
from channels.webhook.sender import Signer, _head
from tests.support.fakes.harness import SECRET


def test_signatures_are_the_packages_byte_for_byte() -> None:
    now = datetime.now(UTC)
    for secret in (SECRET, "whsec_" + "c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24="):
        for body in ('{"a": 1}', 'é"\\ \n😀' * 50, ""):
            expected = Webhook(secret).sign("msg_1", now, body)
            assert Signer(secret).sign("msg_1", int(now.timestamp()), body.encode()) == expected


def test_the_body_head_is_what_json_dumps_writes() -> None:
    for n, kind in enumerate(EVENT_TYPES):
        fields = {"type": kind, "request_id": "r", "from": "a", "to": "b"}
        event = parse_entry("s", "q", f"17357870450{n:02d}-0", fields)
        head = json.dumps({"type": event.type, "timestamp": event.at.isoformat()})
        assert _head(event) == f'{head[:-1]}, "data": '


def test_history_notes_are_pydantics_text_at_whole_seconds_too() -> None:
    from broker.domain.models import HistoryEntry
    from notifiers.commit import _note, _stamp

    for now in (datetime(2026, 12, 1, 18, 0, 0, tzinfo=UTC), datetime.now(UTC)):
        for detail in ("-> HTTP 204 (msg_1)", 'é"\\ \n\t\x01\x7f\u2028 😀', None):
            expected = HistoryEntry(at=now, event="delivery_failed", channel="w:é", detail=detail)
            got = _note(_stamp(now), "delivery_failed", "w:é", detail)
            assert got == expected.model_dump_json(exclude_none=True)


def test_routes_worked_out_once_per_kind_of_event_are_the_routes(redis: Redis) -> None:
    from broker.domain.config import parse_config
    from broker.facade import Broker
    from channels.inbox.sender import InboxSender
    from channels.retry import RetryPolicy
    from channels.sender import Sender
    from notifiers.router import Router

    class Stub(Sender):
        def __init__(self, name: str, kind: str, wanted: tuple[str, ...] | None = None) -> None:
            super().__init__(name, policy=RetryPolicy(1, 1.0, 1.0), concurrency=1)
            self.kind, self.wanted = kind, wanted

        def wants(self, event: Any) -> bool:
            return self.wanted is None or (event.type in self.wanted and not event.moved_away)

        def deliver(self, task: Any) -> str | None:
            return None

    queue_channels = ["inbox", "webhook:a", "slack:s", "email:e"]
    hook = {"url": "http://127.0.0.1:9/h", "secret": SECRET}
    config = parse_config(
        {
            "queues": {"q": {"channels": queue_channels}, "r": {"channels": ["webhook:a"]}},
            "webhooks": {"a": hook, "cb": hook},
            "slack": {
                "bot_token": "x",
                "signing_secret": "y",
                "channels": {"s": {"channel": "C1"}},
            },
            "email": {
                "smtp_url": "smtp://127.0.0.1:9",
                "from": "a@example.com",
                "public_url": "https://x.example.com",
                "lists": {"e": {"to": ["b@example.com"], "unmapped_may_decide": True}},
            },
        }
    )
    channels: dict[str, Sender] = {
        "inbox": InboxSender(),
        "webhook:a": Stub("webhook:a", "webhook"),
        "webhook:cb": Stub("webhook:cb", "webhook"),
        "slack:s": Stub("slack:s", "slack"),
        "email:e": Stub("email:e", "email", ("approval.requested", "approval.escalated")),
    }
    router = Router(Broker(redis, config), channels, {}, None, None, None, None)  # type: ignore[arg-type]
    events = []
    for n, kind in enumerate(EVENT_TYPES):
        for queue in ("q", "r", "nowhere"):
            for extra in (
                {},
                {"ruled_at_create": "1"},
                {"from": "q", "to": "r"},
                {"from": "r", "to": "q"},
            ):
                if kind == "approval.escalated" and not extra.get("from"):
                    continue
                fields = {"type": kind, "request_id": "x", **extra}
                events.append(parse_entry("s", queue, f"{n + 1}-0", fields))
    seen = set()
    for callback in (None, "cb"):
        for _ in range(2):  # worked out, then from what was kept
            for event in events:
                routed = router.route(event, callback)
                assert routed == router._route(event, callback)
                seen.add(tuple(routed))
    assert len(seen) >= 6  # the kinds of event really route differently
