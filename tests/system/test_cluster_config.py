"""The cluster switch: APPROVAL_BROKER_REDIS_CLUSTER or `[broker] redis_cluster`, and RQ's Redis.

A clustered broker keeps RQ on a separate single Redis (APPROVAL_BROKER_RQ_REDIS_URL) and refuses
to start without one, rather than failing later with CROSSSLOT inside RQ.
"""

from __future__ import annotations

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import parse_config
from broker.domain.settings import Settings
from broker.redis.cluster import ClusterConfigError, clustered, connect_cluster, rq_connection
from broker.redis.local_cluster import LocalCluster


def test_the_environment_or_the_config_file_turns_the_cluster_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("APPROVAL_BROKER_REDIS_CLUSTER", "APPROVAL_BROKER_RQ_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    plain = parse_config({})
    assert not clustered(Settings(), plain)
    assert clustered(Settings(), parse_config({"broker": {"redis_cluster": True}}))
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_CLUSTER", "1")
    monkeypatch.setenv("APPROVAL_BROKER_RQ_REDIS_URL", "redis://rq:6379/0")
    settings = Settings()
    assert clustered(settings, plain)
    assert settings.rq_redis_url == "redis://rq:6379/0"


def test_a_clustered_broker_without_an_rq_redis_is_refused_in_one_line() -> None:
    with pytest.raises(ClusterConfigError, match="needs APPROVAL_BROKER_RQ_REDIS_URL") as refused:
        rq_connection("redis://node:7000", None, cluster=True)
    assert "\n" not in str(refused.value)


def test_rq_runs_on_its_own_redis_or_else_on_the_brokers(redis_url: str) -> None:
    own = rq_connection("redis://unused:1/0", redis_url, cluster=True, patient=True)
    shared = rq_connection(redis_url, None, cluster=False)
    for client in (own, shared):
        assert isinstance(client, Redis) and client.ping()
        client.close()


def test_connect_cluster_from_one_nodes_url_finds_every_master(
    redis_cluster: LocalCluster,
) -> None:
    redis_cluster.wait_ready()
    for patient in (False, True):
        client = connect_cluster(redis_cluster.url, patient=patient)
        assert isinstance(client, RedisCluster)
        assert {n.port for n in client.get_primaries()} == {
            redis_cluster.nodes[m].port for m in redis_cluster.masters()
        }
        client.set("ab:{c}:k", b"\xff")
        assert client.get("ab:{c}:k") == b"\xff"  # bytes, as the single-node client returns
        client.close()
