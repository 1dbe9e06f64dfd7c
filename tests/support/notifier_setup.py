"""The notifier tests' shared set-up: the fakes a notifier delivers to (a Slack API, an SMTP
sink, a webhook receiver) as fixtures, the config sections that point at them, and how a test
sees that the notifier group has read (and acknowledged) a queue's stream.

A module takes the fakes by importing the fixtures (`fake_receiver`, `fake_slack`, `fake_smtp`:
named `receiver`, `slack`, `smtp` in tests). The stream helpers read every partition, so they
hold on a Redis Cluster too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.store.keys import NOTIFIER_GROUP
from tests.support.fakes.harness import SECRET, webhook
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.smtp import SmtpSink
from tests.support.fakes.webhook_receiver import WebhookReceiver

PUBLIC = "https://approvals.example.com"
LEADS = {"leads": {"to": ["lead@example.com", "cfo@example.com"], "unmapped_may_decide": True}}
"""Addresses no approver has: links only because the list lets them decide."""


@pytest.fixture(name="receiver")
def fake_receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver(SECRET).start()
    yield server
    server.stop()


@pytest.fixture(name="slack")
def fake_slack() -> Iterator[FakeSlack]:
    server = FakeSlack().start()
    yield server
    server.stop()


@pytest.fixture(name="smtp")
def fake_smtp() -> Iterator[SmtpSink]:
    server = SmtpSink().start()
    yield server
    server.stop()


def slack_section(
    fake: FakeSlack, *, signing_secret: str = "signing", channels: Iterable[str] = ("approvals",)
) -> dict[str, Any]:
    """`[slack]` on the fake; channel N of `channels` is Slack channel C<N+1>."""
    return {
        "bot_token": fake.token,
        "signing_secret": signing_secret,
        "api_base_url": fake.url,
        "channels": {name: {"channel": f"C{i + 1}"} for i, name in enumerate(channels)},
    }


def email_section(
    sink: SmtpSink, *, public_url: str = PUBLIC, lists: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """`[email]` on the sink, with the mailing `lists` (default: LEADS)."""
    return {
        "smtp_url": sink.url,
        "from": "approvals@example.com",
        "public_url": public_url,
        "lists": LEADS if lists is None else lists,
        **extra,
    }


def every_channel(
    receiver: WebhookReceiver, slack: FakeSlack, smtp: SmtpSink, **config: Any
) -> dict[str, Any]:
    """A config on all three fakes (webhook `ops`, Slack `approvals`, the `leads` list), plus
    `config` (the queues, approvers, ...)."""
    return {
        "webhooks": {"ops": webhook(receiver.url("/ops"))},
        "slack": slack_section(slack),
        "email": email_section(smtp),
        **config,
    }


def make_broker(redis: Redis, raw: dict[str, Any]) -> Broker:
    return Broker(redis, parse_config(raw), prefix="t:")


def refund(**extra: Any) -> NewRequest:
    return NewRequest(tool_name="refund", args={"order_id": "A1", "amount": 120}, **extra)


def _streams(broker: Broker, queue: str) -> list[tuple[str, bytes]]:
    """The queue's stream of every partition that has entries, with its last entry's id."""
    found = []
    for keys in broker.keys.parts():
        last = broker.redis.xrevrange(keys.stream(queue), count=1)
        if last:
            found.append((keys.stream(queue), last[0][0]))
    return found


def _group(broker: Broker, stream: str) -> dict[str, Any] | None:
    for group in broker.redis.xinfo_groups(stream):
        if group["name"] in (NOTIFIER_GROUP, NOTIFIER_GROUP.encode()):
            return group  # type: ignore[no-any-return]
    return None


def settled(broker: Broker, queue: str = "default") -> bool:
    """Every entry of the queue's stream (every partition's) was read and acknowledged."""
    streams = _streams(broker, queue)
    groups = [(_group(broker, stream), last) for stream, last in streams]
    return bool(streams) and all(
        g is not None and g["pending"] == 0 and g["last-delivered-id"] == last for g, last in groups
    )


def read_all(broker: Broker, queue: str = "default") -> bool:
    """The group has read every entry of the queue's stream (acknowledged or not)."""
    streams = _streams(broker, queue)
    groups = [(_group(broker, stream), last) for stream, last in streams]
    return bool(streams) and all(
        g is not None and g["last-delivered-id"] == last for g, last in groups
    )


def pending(broker: Broker, queue: str = "default") -> int:
    """Entries of the queue's stream the group handed out and nobody acknowledged yet."""
    return sum(
        int(broker.redis.xpending(stream, NOTIFIER_GROUP)["pending"])
        for stream, _ in _streams(broker, queue)
    )


def quiet(broker: Broker) -> bool:
    """Every queue's stream that has entries was read and acknowledged (nothing in flight)."""
    return all(settled(broker, q) for q in broker.config.queues if _streams(broker, q))
