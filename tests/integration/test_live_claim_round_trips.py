"""A live job's wake-up costs it one round trip: whether every call of its round has an
outcome, the claim of the round and what the job goes on with, in one step (`claim.lua`, from
`broker.runs.live_wait.wait_and_claim`); a check, then a claim with its reads, were two. The
module has a Redis of its own: Redis counts round trips server-wide."""

from __future__ import annotations

import threading
import time

from redis import Redis

from broker.domain.models import Decision, NewRequest
from broker.facade import Broker
from broker.runs.live_wait import LIVE, claimed_by, wait_and_claim
from tests.support.cluster_reads import blocked_reads
from tests.support.counted_redis import (
    redis_server,  # noqa: F401 - counts need a Redis of their own
    round_trips,
)
from tests.support.waiting import wait_for


def test_a_live_wait_claims_and_reads_its_complete_round_in_one_round_trip(
    broker: Broker, redis_url: str
) -> None:
    broker.create_run("refunds", "go", run_id="run-done")
    [done] = broker.create_round("run-done", 1, [NewRequest(tool_name="refund")])
    broker.decide(done.id, Decision(outcome="approved"), decided_by="ann")
    # another wait keeps the process's reader running, blocked in its read, so this one starts
    # no reader of its own: what it sends is its claim alone
    broker.create_run("refunds", "go", run_id="run-open")
    [still] = broker.create_round("run-open", 1, [NewRequest(tool_name="refund")])
    other = threading.Thread(target=lambda: wait_and_claim(broker, "run-open", 1, 30))
    other.start()
    try:
        wait_for(lambda: blocked_reads(broker) == 1)
        counter = Redis.from_url(redis_url)
        before = round_trips(counter)
        got = wait_and_claim(broker, "run-done", 1, 5, until=time.time() + 5, request_ids=[done.id])
        trips = round_trips(counter) - before - 1  # less this INFO
        counter.close()
    finally:
        broker.decide(still.id, Decision(outcome="approved"), decided_by="ann")
        other.join(10)
    assert trips == 1
    assert got is not None and [r.id for r in got.requests or []] == [done.id]
    assert got.fields["status"] and claimed_by(broker, "run-done", 1) == LIVE
    assert claimed_by(broker, "run-open", 1) == LIVE  # the other wait, woken by its outcome
