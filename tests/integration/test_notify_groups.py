"""A running notifier whose stream and consumer group are deleted under it makes the group
again and goes on delivering (Redis's NOGROUP, raised as `GroupMissing` by the store's reads)."""

from __future__ import annotations

import threading

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.facade import Broker
from channels.retry import RetryPolicy
from channels.sender import Delivery, Sender
from notifiers.consumer import Notifier
from tests.support.fakes.harness import SECRET, options
from tests.support.waiting import wait_for


class Recorded(Sender):
    kind = "webhook"

    def __init__(self) -> None:
        super().__init__("webhook:a", policy=RetryPolicy(1, 1.0, 1.0), concurrency=2)
        self.seen: list[str] = []
        self._lock = threading.Lock()

    def deliver(self, delivery: Delivery) -> str | None:
        with self._lock:
            self.seen.append(delivery.event.request_id)
        return "ok"


def test_a_deleted_stream_and_group_are_made_again_and_delivery_goes_on(redis: Redis) -> None:
    config = parse_config(
        {
            "queues": {"default": {"channels": ["webhook:a"]}},
            "webhooks": {"a": {"url": "http://127.0.0.1:9/h", "secret": SECRET}},
        }
    )
    broker = Broker(redis, config, prefix="grp:")
    channel = Recorded()
    notifier = Notifier(broker, {"webhook:a": channel}, options(), name="n1").start()
    try:
        first = broker.create_request(NewRequest(tool_name="refund", args={"n": 1}))
        wait_for(lambda: first.id in channel.seen)
        redis.delete(broker.keys.stream("default"))  # the stream, and its group with it
        second = broker.create_request(NewRequest(tool_name="refund", args={"n": 2}))
        wait_for(lambda: second.id in channel.seen)
    finally:
        notifier.stop()
    groups = redis.xinfo_groups(broker.keys.stream("default"))
    assert [g["name"] for g in groups] == [b"notifiers"]
    assert not notifier.failed.is_set()
