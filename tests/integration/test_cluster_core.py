"""The broker's own steps on a single Redis and on a Redis Cluster (issue 19), one test each.

`any_broker` is a Broker on either; on the cluster its keys are split into partitions (hash
tags), so every Lua step must touch one slot only, or the cluster refuses it with CROSSSLOT.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import Config
from broker.domain.errors import Conflict
from broker.domain.models import Decision, NewRequest, Status
from broker.facade import Broker
from broker.redis.cluster import marker_key
from broker.store.partitions import CLUSTER_PARTITIONS


@pytest.fixture(params=["single", "cluster"])
def any_broker(request: pytest.FixtureRequest, config: Config) -> Iterator[Broker]:
    """A broker on a single Redis (one partition) or on the local cluster (16)."""
    if request.param == "single":
        client: Redis | RedisCluster = Redis.from_url(request.getfixturevalue("redis_url"))
    else:
        client = request.getfixturevalue("cluster_client")
    yield Broker(client, config, prefix="t:")


def new(tool: str = "refund", **args: object) -> NewRequest:
    return NewRequest(tool_name=tool, args=args or {"order": "A1"})


def test_partitions_one_on_a_single_redis_sixteen_on_a_cluster(any_broker: Broker):
    clustered = isinstance(any_broker.redis, RedisCluster)
    assert any_broker.keys.partitions == (CLUSTER_PARTITIONS if clustered else 1)
    key = any_broker.keys.request("req_1")
    assert (key.startswith("{t:p")) is clustered
    assert key.endswith("req:req_1")


def test_create_then_decide(any_broker: Broker):
    made = any_broker.create_request(new())
    got = any_broker.get_request(made.id)
    assert got.status is Status.pending
    decided = any_broker.decide(made.id, Decision(outcome="approved"), decided_by="ann")
    assert decided.status is Status.approved
    assert any_broker.get_request(made.id).status is Status.approved


def test_first_decision_wins_among_threads(any_broker: Broker):
    made = any_broker.create_request(new())
    barrier = threading.Barrier(8)

    def decide(i: int) -> str:
        barrier.wait()
        try:
            outcome = "approved" if i % 2 else "rejected"
            any_broker.decide(made.id, Decision(outcome=outcome), decided_by=f"u{i}")
        except Conflict:
            return "lost"
        return "won"

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(decide, range(8)))
    assert results.count("won") == 1
    assert any_broker.get_request(made.id).status in (Status.approved, Status.rejected)


def test_bulk_create_spans_partitions_and_keeps_order(any_broker: Broker):
    made = any_broker.create_requests([new(order=str(i)) for i in range(40)])
    assert [r.args["order"] for r in made] == [str(i) for i in range(40)]
    parts = {any_broker.keys.partition_of_request(r.id) for r in made}
    assert (len(parts) > 1) is (any_broker.keys.partitions > 1)  # 40 ids over 16: never one
    assert any_broker.counts()["pending:default"] == 40
    assert {r.id for r in any_broker.get_requests(r.id for r in made)} == {r.id for r in made}


def test_listing_merges_partitions_newest_first_and_pages_without_gaps(any_broker: Broker):
    made = any_broker.create_requests([new(order=str(i)) for i in range(30)])
    for r in made[:10]:
        any_broker.decide(r.id, Decision(outcome="approved"), decided_by="ann")
    seen: list[str] = []
    cursor = None
    while True:
        page = any_broker.requests.list_page(limit=7, cursor=cursor)
        seen += [r.id for r in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == sorted(r.id for r in made) and len(seen) == 30
    pending = any_broker.requests.list_page(status=Status.pending, limit=100).items
    assert {r.id for r in pending} == {r.id for r in made[10:]}
    expiries = [r.expires_at for r in pending]
    assert expiries == sorted(expiries)  # soonest to expire first, across partitions
    approved = any_broker.requests.list_page(status=Status.approved, queue="default").items
    assert {r.id for r in approved} == {r.id for r in made[:10]}


def test_sweep_escalates_then_times_out_in_every_partition(any_broker: Broker):
    made = any_broker.create_requests([new(order=str(i)) for i in range(12)])
    far = time.time() + 10_000
    swept = any_broker.sweep(now=far)
    assert {(s.request_id, s.action, s.to_queue) for s in swept} == {
        (r.id, "escalated", "managers") for r in made
    }
    swept = any_broker.sweep(now=far + 10_000)
    assert {(s.request_id, s.action) for s in swept} == {(r.id, "timed_out") for r in made}
    assert all(any_broker.get_request(r.id).status is Status.timed_out for r in made)
    assert any_broker.sweeping.next_due_in() is None


def test_escalate_moves_the_request_and_its_counts(any_broker: Broker):
    made = any_broker.create_request(new())
    moved = any_broker.escalate(made.id, "managers", decided_by="ann")
    assert moved.queue == "managers"
    counts = any_broker.counts()
    assert counts.get("pending:default", 0) == 0 and counts["pending:managers"] == 1


def test_a_round_fully_answered_lands_in_its_partitions_outbox(any_broker: Broker):
    any_broker.create_run("refunds", "go", run_id="run-x1")
    calls = [new(order="1"), new(order="2")]
    made = any_broker.create_round("run-x1", 1, calls)
    keys = any_broker.keys.of_run("run-x1")
    assert {any_broker.keys.partition_of_request(r.id) for r in made} == {keys.at}
    for r in made:
        any_broker.decide(r.id, Decision(outcome="approved"), decided_by="ann")
    outbox = any_broker.redis.xrange(keys.resumes)
    assert [(f[b"run_id"], f[b"round"]) for _, f in outbox] == [(b"run-x1", b"1")]


def test_a_decision_waits_for_a_replica_on_a_cluster_only(any_broker: Broker):
    made = any_broker.create_request(new())
    any_broker.decide(made.id, Decision(outcome="approved"), decided_by="ann")
    first = any_broker.keys.of_request(made.id).expiry  # the step's first key
    waited = any_broker.redis.exists(marker_key(first))  # WAIT's marker, beside it
    assert waited == (1 if isinstance(any_broker.redis, RedisCluster) else 0)
