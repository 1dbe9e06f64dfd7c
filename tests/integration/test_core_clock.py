"""One clock: expiry, sweeps and the times a step records come from Redis (TIME), not the caller.

Each test runs with the Python clock an hour fast and an hour slow (`time.time` patched for
every module): a request must still expire on time by Redis's clock, never early nor late.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from broker.domain.models import Decision, NewRequest, Status
from broker.facade import Broker
from tests.support.waiting import wait_for
from workers.sweeper import sweep_due, sweep_forever

HOUR = 3600.0


@pytest.fixture(params=[HOUR, -HOUR], ids=["fast", "slow"])
def skew(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + request.param)
    yield request.param


def redis_now(broker: Broker) -> float:
    seconds, micros = broker.redis.time()
    return seconds + micros / 1e6


def test_requests_expire_on_redis_time_whatever_the_callers_clock(broker: Broker, skew: float):
    assert abs(time.time() - redis_now(broker) - skew) < 5  # the skew is in force
    before = redis_now(broker)
    request = broker.create_request(NewRequest(tool_name="t", timeout_s=30))
    after = redis_now(broker)
    assert before <= request.created_at.timestamp() <= after
    assert before + 30 <= request.expires_at.timestamp() <= after + 30
    assert broker.get_request(request.id) == request
    score = broker.redis.zscore(broker.keys.expiry, request.id)
    assert score == pytest.approx(request.expires_at.timestamp(), abs=1e-6)
    moved = broker.escalate(request.id, decided_by="alice")
    assert before + 1800 <= moved.expires_at.timestamp() <= redis_now(broker) + 1800
    assert before <= moved.history[0].at.timestamp() <= redis_now(broker)
    done = broker.decide(request.id, Decision(outcome="approved"), decided_by="bob")
    assert before <= done.decision.decided_at.timestamp() <= redis_now(broker)


def test_a_skewed_sweeper_expires_neither_early_nor_late(broker: Broker, skew: float):
    broker.config.queues["default"].escalate_to = None  # time out instead of escalating
    request = broker.create_request(NewRequest(tool_name="t", timeout_s=1.0))
    assert sweep_due(broker) == []  # a fast clock would have timed it out already
    assert broker.get_request(request.id).is_pending
    stop = threading.Event()
    # a long interval: only waking at the next expiry (on Redis's clock) makes it in time
    sweeper = threading.Thread(target=sweep_forever, args=(broker, stop), kwargs={"interval": 30})
    sweeper.start()
    try:
        done = wait_for(
            lambda: (r := broker.get_request(request.id)).status is Status.timed_out and r,
            timeout=10,
        )
    finally:
        stop.set()
        sweeper.join(10)
    expires = request.expires_at.timestamp()
    decided = done.decision.decided_at.timestamp()  # Redis's clock when the step ran
    assert expires <= decided < expires + 1.0
    assert done.decision.reason == "No one answered within 1 seconds."


def test_next_due_in_is_counted_on_redis_time(broker: Broker, skew: float):
    assert broker.sweeping.next_due_in() is None
    broker.create_request(NewRequest(tool_name="t", timeout_s=100))
    assert 95 < broker.sweeping.next_due_in() <= 100


def test_an_explicit_now_still_wins(broker: Broker, skew: float):
    request = broker.create_request(NewRequest(tool_name="t", timeout_s=100))
    assert broker.sweep(now=redis_now(broker) + 50) == []
    [moved] = broker.sweep(now=redis_now(broker) + 101)
    assert (moved.request_id, moved.action, moved.to_queue) == (request.id, "escalated", "managers")


@pytest.mark.parametrize(
    "when",
    [
        datetime(2027, 2, 28, 23, 59, 59, 500000, tzinfo=UTC),
        datetime(2028, 2, 29, 12, 0, 0, 1, tzinfo=UTC),
        datetime(2028, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        datetime(2100, 3, 1, tzinfo=UTC),
        datetime(2400, 2, 29, 6, 7, 8, 90, tzinfo=UTC),
    ],
)
def test_times_written_by_a_step_read_back_exactly(broker: Broker, when: datetime):
    """The steps write ISO 8601 themselves (Lua has no date library): leap days, year ends."""
    broker.config.queues["default"].escalate_to = None
    request = broker.create_request(NewRequest(tool_name="t", timeout_s=1))
    [result] = broker.sweep(now=when.timestamp())
    assert result.action == "timed_out"
    decided_at = broker.get_request(request.id).decision.decided_at
    assert abs((decided_at - when).total_seconds()) <= 2e-6
