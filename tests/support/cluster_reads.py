"""Helpers of the reader tests on a single Redis and on the local Redis Cluster."""

from __future__ import annotations

from redis.cluster import RedisCluster

from broker.facade import Broker


def blocked_reads(broker: Broker) -> int:
    """XREADs blocked on the broker's Redis (every master of a cluster) now.

    Only blocked ones: an idle pooled connection's last command may be an XREAD too."""
    if isinstance(broker.redis, RedisCluster):
        lists = broker.redis.client_list(target_nodes=RedisCluster.PRIMARIES)
        clients = [c for node in lists.values() for c in node] if isinstance(lists, dict) else lists
    else:
        clients = broker.redis.client_list()
    return sum(1 for c in clients if c["cmd"] == "xread" and "b" in c["flags"])
