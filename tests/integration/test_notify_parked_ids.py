"""A parked delivery's id names one delivery: two entries of a queue's streams in two cluster
partitions may share an entry id (each stream numbers its own), and their deliveries must
still be two records; a record is rescheduled under the id it is stored under."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.events import REQUESTED, parse_entry
from broker.facade import Broker
from channels.retry import Retry, RetryPolicy
from channels.sender import Delivery, Sender
from notifiers.dispatch import Dispatcher
from notifiers.parking import Parked, ParkedStore
from notifiers.results import DeliveryResult
from notifiers.tasks import InflightEntry, Task
from tests.support.waiting import wait_for

CONFIG = parse_config({"queues": {"default": {"channels": ["inbox"]}}})
CHANNEL = "test:parked"


def test_two_partitions_entries_with_one_id_are_parked_as_two_deliveries(redis: Redis) -> None:
    store = ParkedStore(Broker(redis, CONFIG, prefix="pid:"), lease_s=30)
    events = [
        parse_entry(f"{{pid:p{n}}}:stream:default", "default", "1700000000000-0", fields)
        for n, fields in enumerate(
            [{"type": REQUESTED, "request_id": "req_a"}, {"type": REQUESTED, "request_id": "req_b"}]
        )
    ]
    store.park([(Parked.of(e, CHANNEL, attempts=0, defers=0), time.time() - 1) for e in events])
    assert store.count(CHANNEL) == 2
    taken = store.take(CHANNEL, 10)
    requests = {Parked.load(CHANNEL, task, raw).event().request_id for task, raw in taken}
    assert requests == {"req_a", "req_b"}


class FailsOnce(Sender):
    kind = "test"

    def __init__(self) -> None:
        super().__init__(CHANNEL, policy=RetryPolicy(3, 5.0, 5.0), concurrency=1)
        self.tried = threading.Event()

    def deliver(self, delivery: Delivery) -> str | None:
        self.tried.set()
        raise Retry("try again later")


@pytest.fixture
def dispatcher(redis: Redis) -> Iterator[tuple[Dispatcher, ParkedStore, FailsOnce]]:
    store = ParkedStore(Broker(redis, CONFIG, prefix="pid:"), lease_s=30)
    channel = FailsOnce()
    results: list[DeliveryResult] = []
    dispatch = Dispatcher({CHANNEL: channel}, results.append, lambda task, error: None, store)
    yield dispatch, store, channel
    dispatch.close()


def test_a_retried_parked_delivery_is_rescheduled_under_its_stored_id(
    redis: Redis, dispatcher: tuple[Dispatcher, ParkedStore, FailsOnce]
) -> None:
    """A record parked under an id of another form (as notifiers before the request's id was
    in it wrote) keeps it: its schedule moves, and no second record is left behind."""
    dispatch, store, channel = dispatcher
    event = parse_entry(
        "pid:stream:default", "default", "1700000000000-0", {"type": REQUESTED, "request_id": "r"}
    )
    old_id = f"{event.event_id}:{event.queue}"
    record = Parked.of(event, CHANNEL, attempts=0, defers=0)
    store.park([(replace(record, id=old_id), time.time() - 1)])
    ((task_id, raw),) = store.take(CHANNEL, 1)
    parked = Parked.load(CHANNEL, task_id, raw)
    entry = InflightEntry(parked.event(), None, remaining={CHANNEL})
    task = Task(entry, CHANNEL, attempts=parked.attempts, defers=parked.defers)
    task.parked = parked.id
    entry.tasks.append(task)
    dispatch.adopt(task)
    assert channel.tried.wait(5)
    keys = Broker(redis, CONFIG, prefix="pid:").keys

    def attempts() -> int:
        raw = redis.hget(keys.parked_tasks(CHANNEL), old_id)
        return Parked.load(CHANNEL, old_id, raw.decode()).attempts if raw else -1

    wait_for(lambda: attempts() == 1)  # rescheduled with its try counted
    assert [k.decode() for k in redis.hkeys(keys.parked_tasks(CHANNEL))] == [old_id]
    due = redis.zscore(keys.parked(CHANNEL), old_id)
    assert (
        due is not None and time.time() + 1 < due < time.time() + 6
    )  # its back-off, not the lease
