"""A notifier's batch of entries costs a fixed number of Redis round trips, however many entries
it holds: one read, one load of their requests, and one bookkeeping step per committer batch
(`broker.notifier_reads`, `broker.stored_requests`, `broker.commits`)."""

from __future__ import annotations

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.events import REQUESTED, Event
from broker.domain.models import Decision, NewRequest
from broker.facade import Broker
from channels.inbox.sender import InboxSender
from channels.retry import RetryPolicy
from channels.sender import Delivery, Sender
from notifiers.consumer import Notifier
from tests.support.counted_redis import (
    calls,
    redis_server,  # noqa: F401 - counts need a Redis of their own
    round_trips,
)
from tests.support.fakes.harness import SECRET, options
from tests.support.waiting import wait_for

N = 200


class Delivered(Sender):
    """A channel every delivery reaches at once (its note goes to the request's history)."""

    kind = "webhook"

    def __init__(self) -> None:
        super().__init__("webhook:a", policy=RetryPolicy(1, 1.0, 1.0), concurrency=4)

    def deliver(self, delivery: Delivery) -> str | None:
        return "ok"


def on_webhook(redis_url: str, prefix: str) -> tuple[Redis, Broker]:
    """A broker whose queue sends to the webhook endpoint `a` (its notifier's sender is the
    test's own)."""
    redis = Redis.from_url(redis_url)
    config = parse_config(
        {
            "queues": {"default": {"channels": ["webhook:a"]}},
            "webhooks": {"a": {"url": "http://127.0.0.1:9/h", "secret": SECRET}},
        }
    )
    return redis, Broker(redis, config, prefix=prefix)


def test_a_batch_of_entries_costs_a_fixed_number_of_round_trips(redis_url: str) -> None:
    redis, broker = on_webhook(redis_url, "rt:")
    notifier = Notifier(broker, {"webhook:a": Delivered()}, options(batch=N), name="n1")
    try:  # driven by hand (no threads of its own but the pools and the committer)
        notifier.ensure_groups()
        broker.create_requests([NewRequest(tool_name="refund", args={"i": -1})])
        assert notifier.reader.read_once()  # scripts loaded, connections made
        wait_for(lambda: len(notifier.inflight) == 0)
        broker.create_requests([NewRequest(tool_name="refund", args={"i": i}) for i in range(N)])
        steps = calls(redis, "evalsha")
        before = round_trips(redis)
        assert notifier.reader.read_once()
        wait_for(lambda: len(notifier.inflight) == 0)  # every entry delivered and acknowledged
        trips = round_trips(redis) - before - 1  # the INFO above is one
        steps = calls(redis, "evalsha") - steps
    finally:
        notifier.stop()
    assert calls(redis, "xreadgroup") == 2 and 1 <= steps <= 10  # one step per committer batch
    # the read, the requests' load and the committer's steps, each one round trip (Redis counts
    # a large pipeline or step, ~40 KB here, as a few socket reads, more on a busy machine); an
    # entry's own round trip (a request read alone, a marker or an ack sent alone) would make it
    # hundreds
    assert trips <= 6 + 6 * steps, (trips, steps)  # counted 6 to 8 for one step
    pending = redis.xpending(broker.keys.stream("default"), "notifiers")["pending"]
    assert pending == 0
    delivered = redis.hget(broker.keys.stats, "delivered:webhook")
    assert delivered is not None and int(delivered) == N + 1


def loads_of_a_batch(redis: Redis, notifier: Notifier) -> int:
    """Read one batch and wait until its entries are acknowledged: how many requests and
    done-marker sets it loaded."""
    before = calls(redis, "hgetall") + calls(redis, "hkeys")
    assert notifier.reader.read_once()
    wait_for(lambda: len(notifier.inflight) == 0)
    return calls(redis, "hgetall") + calls(redis, "hkeys") - before


def test_a_notifier_with_nothing_to_deliver_acknowledges_a_batch_without_loading_requests(
    redis_url: str,
) -> None:
    """The inbox sends nothing (its page reads Redis): a notifier whose channels are the inbox
    alone reads a batch and acknowledges it, with no request loaded and no done marker read."""
    redis = Redis.from_url(redis_url)
    broker = Broker(
        redis, parse_config({"queues": {"default": {"channels": ["inbox"]}}}), prefix="q:"
    )
    notifier = Notifier(broker, {"inbox": InboxSender()}, options(batch=N), name="n1")
    try:  # driven by hand, as above
        assert notifier.router.quiet
        notifier.ensure_groups()
        broker.create_requests([NewRequest(tool_name="refund", args={"i": i}) for i in range(N)])
        loads = loads_of_a_batch(redis, notifier)
    finally:
        notifier.stop()
    assert loads == 0
    assert redis.xpending(broker.keys.stream("default"), "notifiers")["pending"] == 0
    [group] = redis.xinfo_groups(broker.keys.stream("default"))
    assert (
        group["last-delivered-id"] == redis.xrevrange(broker.keys.stream("default"), count=1)[0][0]
    )


class RequestedOnly(Delivered):
    """A webhook endpoint sent `approval.requested` only (its `events`)."""

    def wants(self, event: Event) -> bool:
        return event.type == REQUESTED


def test_outcomes_no_channel_wants_are_acknowledged_without_loading_their_requests(
    redis_url: str,
) -> None:
    """Decide and sweep name an outcome's callback webhook in its entry ('' for none): when no
    channel keeps copies, an outcome that neither the queue's channels nor that callback want
    is acknowledged as read; a request created before and decided now is not loaded again."""
    redis, broker = on_webhook(redis_url, "o:")
    notifier = Notifier(broker, {"webhook:a": RequestedOnly()}, options(batch=N), name="n1")
    try:  # driven by hand, as above
        notifier.ensure_groups()
        made = broker.create_requests(
            [NewRequest(tool_name="refund", args={"i": i}) for i in range(N)]
        )
        assert notifier.reader.read_once()
        wait_for(lambda: len(notifier.inflight) == 0)  # the requests delivered
        for request in made:
            broker.decide(request.id, Decision(outcome="approved"), decided_by="alice")
        loads = loads_of_a_batch(redis, notifier)  # the outcomes'
    finally:
        notifier.stop()
    assert loads == 0
    assert redis.xpending(broker.keys.stream("default"), "notifiers")["pending"] == 0
    delivered = redis.hget(broker.keys.stats, "delivered:webhook")
    assert delivered is not None and int(delivered) == N  # the requests, not their outcomes
