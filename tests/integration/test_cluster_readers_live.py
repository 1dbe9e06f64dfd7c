"""A run's live wait (`broker.runs.live_wait`, an agent's `live_wait_s`) on a single Redis and on the
local Redis Cluster: the waiting job wakes on the outcome of its round's requests, which live in
the run's partition (chosen here outside partition 0), and claims the round once it is complete,
in the step that finds it so."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import Config
from broker.domain.models import Decision, NewRequest
from broker.facade import Broker
from broker.runs.live_wait import (
    LIVE,
    RESUMER,
    claimed_by,
    live_field,
    wait_and_claim,
)
from broker.store.run_state import RoundClaim
from tests.support.cluster_reads import blocked_reads
from tests.support.round_claims import claim, claim_round
from tests.support.waiting import wait_for


@pytest.fixture(params=["single", "cluster"])
def any_broker(request: pytest.FixtureRequest, config: Config) -> Broker:
    name = "redis" if request.param == "single" else "cluster_client"
    client: Redis | RedisCluster = request.getfixturevalue(name)
    return Broker(client, config, prefix="t:")


def run_outside_partition_0(broker: Broker, calls: int) -> tuple[str, list[str]]:
    """A run (and its round 1 of `calls` requests) in a partition other than the first."""
    n = 0
    while broker.keys.partitions > 1 and broker.keys.partition_of_run(f"run-live{n}") == 0:
        n += 1
    run_id = f"run-live{n}"
    broker.create_run("refunds", "go", run_id=run_id)
    made = broker.create_round(run_id, 1, [NewRequest(tool_name="refund") for _ in range(calls)])
    return run_id, [r.id for r in made]


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_live_wait_wakes_on_its_rounds_outcomes_and_claims_the_round(any_broker: Broker):
    broker = any_broker
    run_id, ids = run_outside_partition_0(broker, 2)
    started = time.monotonic()

    def live_job() -> bool:  # as the runner's live wait: the round claimed and read once complete
        return wait_and_claim(broker, run_id, 1, 30) is not None

    thread, out = in_thread(live_job)
    wait_for(lambda: blocked_reads(broker) == 1)  # one blocking read: the run's partition
    broker.decide(ids[0], Decision(outcome="approved"), decided_by="ann")
    thread.join(0.5)  # a bounded look: a wait that woke on the first outcome would be done
    assert thread.is_alive() and out == []  # one call of the round still pending
    broker.decide(ids[1], Decision(outcome="rejected", reason="no"), decided_by="ann")
    thread.join(10)
    assert out == [True]
    assert time.monotonic() - started < 10  # by the outcomes, not the 30 s
    assert claimed_by(broker, run_id, 1) == LIVE
    assert not claim(broker, run_id, 1, RESUMER)  # the resumer backs off


def test_a_live_wait_gives_up_after_its_time_with_the_round_still_open(any_broker: Broker):
    broker = any_broker
    run_id, ids = run_outside_partition_0(broker, 1)
    started = time.monotonic()
    assert wait_and_claim(broker, run_id, 1, 0.3) is None
    assert time.monotonic() - started >= 0.3
    assert claimed_by(broker, run_id, 1) is None  # a try while the call waited wrote nothing
    broker.decide(ids[0], Decision(outcome="approved"), decided_by="ann")
    assert wait_and_claim(broker, run_id, 1, 5) is not None  # decided before: at once
    assert claimed_by(broker, run_id, 1) == LIVE


def test_many_live_waits_share_one_blocking_read_and_each_wakes_on_its_own_round(
    any_broker: Broker,
) -> None:
    """Ten slots waiting at once (one partition): one XREAD reads the announcements for all of
    them (not one per wait, each woken by every event), and an outcome ends only its own wait."""
    broker = any_broker
    first, _ = run_outside_partition_0(broker, 1)
    partition = broker.keys.partition_of_run(first)
    runs: list[tuple[str, str]] = []
    n = 0
    while len(runs) < 10:
        run_id = f"run-many{n}"
        n += 1
        if broker.keys.partition_of_run(run_id) != partition:
            continue
        broker.create_run("refunds", "go", run_id=run_id)
        [req] = broker.create_round(run_id, 1, [NewRequest(tool_name="refund")])
        runs.append((run_id, req.id))
    waits = [in_thread(lambda r=r: wait_and_claim(broker, r, 1, 30) is not None) for r, _ in runs]
    wait_for(lambda: sum(bool(broker.redis.hget(broker.keys.run(r), live_field(1))) for r, _ in runs) == 10)  # fmt: skip
    wait_for(lambda: blocked_reads(broker) == 1)
    broker.decide(runs[0][1], Decision(outcome="approved"), decided_by="ann")
    waits[0][0].join(10)
    assert waits[0][1] == [True]
    assert all(t.is_alive() and out == [] for t, out in waits[1:])  # the others still wait
    # the reader, woken by that outcome, blocks again: still one read for the nine left
    wait_for(lambda: blocked_reads(broker) == 1)
    for _, rid in runs[1:]:
        broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
    for thread, out in waits[1:]:
        thread.join(10)
        assert out == [True]
    wait_for(lambda: blocked_reads(broker) == 0)  # the reader ends with its last wait


def test_the_live_claim_takes_a_complete_round_for_its_first_claimant_only(
    any_broker: Broker,
) -> None:
    """The live job's claim and its reads in one step: nothing written while a call of the
    round waits; then the run and the round's decided requests when the claim is its own;
    nothing when the resumer claimed the round first, or the run is gone."""
    broker = any_broker
    run_id, ids = run_outside_partition_0(broker, 2)
    broker.decide(ids[0], Decision(outcome="approved"), decided_by="ann")
    assert claim_round(broker, run_id, 1, LIVE) == RoundClaim("pending", None)
    assert claimed_by(broker, run_id, 1) is None  # the other call still waits: not claimed
    broker.decide(ids[1], Decision(outcome="approved"), decided_by="ann")
    got = claim_round(broker, run_id, 1, LIVE)
    assert got.state == "mine" and got.read is not None
    assert got.read.fields["agent"] == "refunds" and got.read.fields["claimed:1"] == LIVE
    assert [r.id for r in got.read.requests or []] == ids
    assert all(r.decision is not None for r in got.read.requests or [])
    assert claim_round(broker, run_id, 1, LIVE).state == "mine"  # its own claim, read again
    run2 = f"{run_id}-b"
    broker.create_run("refunds", "go", run_id=run2)
    [req] = broker.create_round(run2, 1, [NewRequest(tool_name="refund")])
    broker.decide(req.id, Decision(outcome="approved"), decided_by="ann")
    assert claim(broker, run2, 1, RESUMER)
    assert claim_round(broker, run2, 1, LIVE) == RoundClaim("other", None)
    assert claimed_by(broker, run2, 1) == RESUMER
    gone = f"{run_id}-gone"
    assert claim_round(broker, gone, 1, LIVE) == RoundClaim("other", None)
    assert not broker.redis.exists(broker.keys.run(gone))  # the claim made no run of it
