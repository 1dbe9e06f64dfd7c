"""The broker's own steps on a single Redis and on a Redis Cluster (issue 19), one test each.

`any_broker` is a Broker on either; on the cluster its keys are split into partitions (hash
tags), so every Lua step must touch one slot only, or the cluster refuses it with CROSSSLOT.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.client import Broker
from broker.config import Config
from broker.keys import CLUSTER_PARTITIONS
from broker.models import Decision, NewRequest, Status


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
