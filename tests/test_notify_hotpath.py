"""The delivery hot path's hand-written pieces give what the library code they replace gave:
signatures (standardwebhooks), Redis commands (redis-py's packing), reply heads (the regex
the poster used), the body's head (`json.dumps`)."""

from __future__ import annotations

import enum
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import DataError
from standardwebhooks import Webhook

from notifiers.events import EVENT_TYPES, parse_entry
from notifiers.http_post import _field, _fields, _status_line
from notifiers.lean import pack
from notifiers.webhook import Signer, _head
from tests.fakes.harness import SECRET

OLD_HEADER = re.compile(r"^([^:\r\n]+?)[ \t]*:[ \t]*([^\r\n]*)", re.MULTILINE)


def old_parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    """The poster's parser before (a regex over the head)."""
    line, _, rest = head.partition(b"\r\n")
    version, _, status = line.decode("latin-1").partition(" ")
    fields = OLD_HEADER.findall(rest.decode("latin-1"))
    return int(status[:3]), version, {n.lower(): v.strip() for n, v in fields}


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 204 No Content",
        b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 18:05:00 GMT\r\nserver: uvicorn\r\n"
        b"content-length: 2\r\ncontent-type: application/json",
        b"HTTP/1.0 503 Busy\r\nRetry-After:  7 \r\nConnection: close",
        b"HTTP/1.1 429 x\r\nX-A \t: b:c\r\nno colon here\r\nEmpty:\r\nDup: 1\r\ndup: 2",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-\xe9: \xff",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length-X: 9\r\nconnection\r: x",
        b"HTTP/1.1 200 OK\r\nContent-Length : 3\r\nX: a\rb\r\nConnection:keep-alive",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n content-length: 7\r\nContent-Lengthy: 1",
    ],
)
def test_reply_heads_read_as_the_regex_read_them(head: bytes) -> None:
    status, version, rest = _status_line(head)  # as the poster reads a reply's head
    assert (status, version, _fields(rest)) == old_parse_head(head)
    low = "\n" + rest.lower()
    names = ["connection", "content-length", "transfer-encoding", "retry-after", "x-a", "dup"]
    for name in names + ["empty", "no colon here", "x-\xe9", "content", "x"]:
        assert _field(rest, low, name) == old_parse_head(head)[2].get(name), name


def test_signatures_are_the_packages_byte_for_byte() -> None:
    now = datetime.now(UTC)
    for secret in (SECRET, "whsec_" + "c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24="):
        for body in ('{"a": 1}', 'é"\\ \n😀' * 50, ""):
            expected = Webhook(secret).sign("msg_1", now, body)
            assert Signer(secret).sign("msg_1", int(now.timestamp()), body.encode()) == expected


class Kind(enum.StrEnum):
    QUEUE = "queue:é"


class Level(enum.IntEnum):
    HIGH = 3


def test_commands_are_packed_as_redis_py_packs_them() -> None:
    conn = Redis().connection_pool.make_connection()
    commands = [
        ("HGETALL", "ab:req:req_1"),
        ("EVALSHA", "f" * 40, 2, "k:é", b"raw\x00", -7, 2.5, 1e-7, ""),
        ("XACK", "s", "notifiers", "1-0", "2-0"),
    ]
    assert pack(commands) == b"".join(conn.pack_commands(commands))
    for bad in (None, True, [1], bytearray(b"array"), Kind.QUEUE, Level.HIGH):
        with pytest.raises(DataError):  # subclasses too: redis-py writes them two ways
            pack([("SET", "k", bad)])


def test_the_body_head_is_what_json_dumps_writes() -> None:
    for n, kind in enumerate(EVENT_TYPES):
        fields = {"type": kind, "request_id": "r", "from": "a", "to": "b"}
        event = parse_entry("s", "q", f"17357870450{n:02d}-0", fields)
        head = json.dumps({"type": event.type, "timestamp": event.at.isoformat()})
        assert _head(event) == f'{head[:-1]}, "data": '


def test_history_notes_are_pydantics_text_at_whole_seconds_too() -> None:
    from broker.models import HistoryEntry
    from notifiers.commit import _note, _stamp

    for now in (datetime(2026, 12, 1, 18, 0, 0, tzinfo=UTC), datetime.now(UTC)):
        for detail in ("-> HTTP 204 (msg_1)", 'é"\\ \n\t\x01\x7f\u2028 😀', None):
            expected = HistoryEntry(at=now, event="delivery_failed", channel="w:é", detail=detail)
            got = _note(_stamp(now), "delivery_failed", "w:é", detail)
            assert got == expected.model_dump_json(exclude_none=True)


def test_routes_worked_out_once_per_kind_of_event_are_the_routes(redis: Redis) -> None:
    from broker.client import Broker
    from broker.config import parse_config
    from notifiers.base import Channel
    from notifiers.inbox import InboxChannel
    from notifiers.retry import RetryPolicy
    from notifiers.router import Router
    from notifiers.stored import StoredRequest

    class Stub(Channel):
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
    channels: dict[str, Channel] = {
        "inbox": InboxChannel(),
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
        request = StoredRequest("x", callback, None, None, None)
        for _ in range(2):  # worked out, then from what was kept
            for event in events:
                routed = router.route(event, request)
                assert routed == router._route(event, request)
                seen.add(tuple(routed))
    assert len(seen) >= 6  # the kinds of event really route differently
