"""Test harness for Redis Cluster: one real local cluster (3 masters, 3 replicas) per session.

Started by the broker's own launcher (`broker.redis.local_cluster.LocalCluster`), which assigns the
slots itself; no test depends on a cluster already running. A test that kills a node starts it
again before it ends, so the next test finds all six nodes up (roles may have swapped).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from broker.redis.cluster import connect_cluster
from broker.redis.local_cluster import LocalCluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster"), masters=3)
    cluster.start()
    yield cluster
    cluster.close()


@pytest.fixture
def cluster_client(redis_cluster: LocalCluster) -> Iterator[RedisCluster]:
    """A patient cluster client on a cluster whose every master was flushed first."""
    redis_cluster.wait_ready()
    client = connect_cluster(redis_cluster.url, patient=True)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.close()
