"""The dispatcher with real threads: parking calls Redis outside the lock every pool thread
needs, so a stalled Redis call for one channel never holds up the others."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.events import REQUESTED, parse_entry
from broker.facade import Broker
from channels.retry import Retry, RetryPolicy
from channels.sender import Sender
from notifiers.dispatch import Dispatcher
from notifiers.parking import Parked, ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from notifiers.tasks import InflightEntry, Task, TaskState
from tests.support.waiting import wait_for

CONFIG = parse_config({"queues": {"default": {"channels": ["inbox"]}}})
STALL_LIMIT_S = 30.0  # a stalled call gives up after this, so a broken test fails, not hangs


class Gate(Sender):
    """A channel whose deliveries wait for `open` (a hung far end), counting what went out."""

    kind = "test"

    def __init__(self, name: str, *, gated: bool) -> None:
        super().__init__(name, policy=RetryPolicy(3, 5.0, 5.0), concurrency=4)
        self.open = threading.Event()
        if not gated:
            self.open.set()
        self.fail_first = False

    def deliver(self, task: Task) -> str | None:
        assert self.open.wait(STALL_LIMIT_S), "the gate never opened"
        if self.fail_first and task.attempts == 0:
            raise Retry("try again later")
        return "ok"


class StallingStore(ParkedStore):
    """A parked store whose `park` call blocks, as a Redis that stopped answering would."""

    def __init__(self, broker: Broker, lease_s: float) -> None:
        super().__init__(broker, lease_s)
        self.entered = threading.Event()
        self.answer = threading.Event()

    def park(self, items: Iterable[tuple[Parked, float]]) -> None:
        self.entered.set()
        assert self.answer.wait(STALL_LIMIT_S), "Redis never answered"
        super().park(items)


class Setup:
    def __init__(self, redis: Redis) -> None:
        self.broker = Broker(redis, CONFIG, prefix="t:")
        self.slow = Gate("test:slow", gated=True)
        self.fast = Gate("test:fast", gated=False)
        self.store = StallingStore(self.broker, lease_s=30)
        self.results: list[DeliveryResult] = []
        self.lock = threading.Lock()
        self.dispatcher = Dispatcher(
            {c.name: c for c in (self.slow, self.fast)},
            self.report,
            lambda task, error: None,
            self.store,
        )
        self._seq = 0

    def report(self, result: DeliveryResult) -> None:
        with self.lock:
            self.results.append(result)

    def settled(
        self, channel: str, kind: ResultKind = ResultKind.delivered
    ) -> list[DeliveryResult]:
        with self.lock:
            return [r for r in self.results if r.channel == channel and r.kind is kind]

    def task(self, channel: Sender) -> Task:
        self._seq += 1
        event = parse_entry(
            "t:stream:default",
            "default",
            f"{self._seq}-0",
            {"type": REQUESTED, "request_id": f"req_{self._seq}"},
        )
        entry = InflightEntry(event, None, remaining={channel.name})
        task = Task(entry, channel.name)
        entry.tasks.append(task)
        return task

    def park_in_background(self, tasks: list[Task]) -> tuple[threading.Thread, list[Task]]:
        parked: list[Task] = []
        thread = threading.Thread(target=lambda: parked.extend(self.dispatcher.park(tasks)))
        thread.start()
        assert self.store.entered.wait(5), "park never reached Redis"
        return thread, parked

    def close(self) -> None:
        self.store.answer.set()
        self.slow.open.set()
        self.dispatcher.close()


@pytest.fixture
def setup(redis: Redis) -> Iterator[Setup]:
    s = Setup(redis)
    yield s
    s.close()


def test_a_stalled_park_for_one_channel_does_not_stop_deliveries_on_another(
    setup: Setup,
) -> None:
    hung = setup.task(setup.slow)
    setup.dispatcher.submit(hung)
    wait_for(lambda: hung.state is TaskState.running)
    parking, parked = setup.park_in_background([hung])  # stalls inside Redis from here

    # submitted from another thread: were the lock held across the stall, this would block
    fast = [setup.task(setup.fast) for _ in range(20)]
    threading.Thread(target=lambda: [setup.dispatcher.submit(t) for t in fast]).start()
    wait_for(lambda: len(setup.settled("test:fast")) == 20, timeout=5)
    assert parking.is_alive()  # the park call is still stuck while the fast channel delivered

    setup.store.answer.set()  # Redis answers again
    parking.join(5)
    assert parked == [hung] and hung.parked is not None
    assert setup.store.count("test:slow") == 1
    setup.slow.open.set()
    (result,) = wait_for(lambda: setup.settled("test:slow"))
    assert result.parked == hung.parked  # its result settles the parked record


def test_a_task_that_finishes_while_being_parked_stays_the_entrys_own(setup: Setup) -> None:
    """Finished first, so not parked: its result counts for the entry, and no record is left
    behind for another notifier to deliver a second time."""
    task = setup.task(setup.slow)
    setup.dispatcher.submit(task)
    wait_for(lambda: task.state is TaskState.running)
    parking, parked = setup.park_in_background([task])
    setup.slow.open.set()
    (result,) = wait_for(lambda: setup.settled("test:slow"))
    assert result.parked is None
    setup.store.answer.set()
    parking.join(5)
    assert parked == [] and task.parked is None
    assert setup.store.count("test:slow") == 0


def test_a_task_waiting_for_its_retry_is_parked_due_when_it_would_have_run(setup: Setup) -> None:
    setup.slow.open.set()
    setup.slow.fail_first = True  # the first try fails: the task waits out a 2.5-5 s back-off
    task = setup.task(setup.slow)
    submitted = time.time()  # the try fails after this, so its back-off ends 2.5 s after this
    setup.dispatcher.submit(task)
    wait_for(lambda: task.state is TaskState.waiting)
    parking, parked = setup.park_in_background([task])
    setup.store.answer.set()
    parking.join(5)
    assert parked == [task] and task.released
    redis = setup.broker.redis
    due = redis.zscore(setup.broker.keys.parked("test:slow"), task.parked)
    # due when its back-off ends (at most 5 s after it was parked), not at the lease's end (30 s)
    assert due is not None and submitted + 2 < due < time.time() + 6
    raw = redis.hget(setup.broker.keys.parked_tasks("test:slow"), task.parked)
    assert Parked.load("test:slow", task.parked or "", raw.decode()).attempts == 1
