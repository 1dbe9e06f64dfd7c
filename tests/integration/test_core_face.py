"""The services the roles and the channels reach through `Broker` instead of Redis, on a single
Redis and on a Redis Cluster: one-time markers, reason prompts, idempotency claims, the fleet's
figures and the API's asyncio reads. What they say must match what the Lua steps and the sync
store write (a marker the decide step spends reads as spent; a run reads the same either way)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import Config
from broker.domain.errors import Conflict
from broker.domain.models import Decision, NewRequest
from broker.facade import Broker


@pytest.fixture(params=["single", "cluster"])
def any_broker(request: pytest.FixtureRequest, config: Config) -> Iterator[Broker]:
    """A broker on a single Redis (one partition) or on the local cluster (16)."""
    name = "redis" if request.param == "single" else "cluster_client"
    client: Redis | RedisCluster = request.getfixturevalue(name)
    yield Broker(client, config, prefix="t:")


def test_a_marker_named_for_a_request_reads_spent_once_its_decision_spent_it(any_broker: Broker):
    broker = any_broker
    request = broker.create_request(NewRequest(tool_name="refund"))
    once = broker.once.marker("email", "nonce-1", 60, request_id=request.id)
    assert not broker.once.spent(once)
    broker.decide(request.id, Decision(outcome="approved"), decided_by="alice", once=once)
    assert broker.once.spent(once)  # the very key the step wrote, in the request's partition
    with pytest.raises(Conflict) as replay:
        broker.decide(request.id, Decision(outcome="rejected"), decided_by="alice", once=once)
    assert replay.value.code == "replayed"


def test_a_marker_spent_without_a_decision_reads_spent_and_expires(any_broker: Broker):
    broker = any_broker
    once = broker.once.marker("slack", "sig-digest", 30)
    assert not broker.once.spent(once)
    broker.once.spend(once)
    assert broker.once.spent(once)
    assert 0 < broker.redis.ttl(once[0]) <= 30
    assert not broker.once.spent(broker.once.marker("slack", "another", 30))


def test_a_reason_prompt_is_kept_read_and_dropped(any_broker: Broker):
    prompts = any_broker.reason_prompts
    assert prompts.read("telegram", "7:42") is None
    prompts.keep("telegram", "7:42", {"request_id": "req_1", "user_id": 9}, 60)
    assert prompts.read("telegram", "7:42") == {"request_id": "req_1", "user_id": 9}
    assert prompts.read("telegram", "7:43") is None
    prompts.drop("telegram", "7:42")
    assert prompts.read("telegram", "7:42") is None


def test_an_idempotency_claim_is_taken_once_filled_and_released(any_broker: Broker):
    claim = any_broker.idempotency.claim("requests", "svc", "key-1")
    assert claim.take("hash-a", 30)
    assert not claim.take("hash-a", 30)  # held: a concurrent create waits for the id
    assert claim.read() == ("hash-a", "")
    claim.fill("hash-a", "req_1", 3600)
    assert claim.read() == ("hash-a", "req_1")
    other = any_broker.idempotency.claim("requests", "someone-else", "key-1")
    assert other.read() is None  # the key is the caller's own
    claim.release()
    assert claim.read() is None


def test_the_fleet_figures_count_what_is_there(any_broker: Broker):
    broker = any_broker
    fleet = broker.fleet
    assert fleet.ping() >= 0
    assert fleet.server()["version"]
    assert fleet.dead_letter_count() == 0
    broker.dead_letter("test", "boom")
    assert fleet.dead_letter_count() == 1
    assert fleet.rule_count() == 0 and fleet.rule_hits() == {}
    assert fleet.delivery_stats() == {}
    assert fleet.notifier_consumers(["default"]) == []  # no notifier has read yet


def test_the_async_reads_see_the_queue_stream_and_read_a_run_as_the_sync_store_does(
    any_broker: Broker,
):
    broker = any_broker
    run = broker.create_run("refunds", "refund A1", extra={"started_by": "svc"})

    async def reads_now() -> tuple[object, str | None, int]:
        reads = broker.async_reads()
        try:
            got_run, starter = await reads.run(run.id)
            streams = [s for group in reads.partition_streams(["default"]) for s in group]
            positions = await reads.newest(streams)
            request = await asyncio.to_thread(broker.create_request, NewRequest(tool_name="refund"))
            seen = 0
            for group in reads.partition_streams(["default"]):
                cursor = {s: positions[s] for s in group}
                for _, entries in await reads.read(cursor, 10):
                    seen += sum(1 for _, f in entries if f[b"request_id"] == request.id.encode())
            return got_run, starter, seen
        finally:
            await reads.aclose()

    got_run, starter, seen = asyncio.run(reads_now())
    assert got_run == broker.get_run(run.id) and starter == "svc"
    assert seen == 1  # the create's event, after the positions taken before it
