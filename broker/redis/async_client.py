"""An asyncio client on the broker's Redis, for blocking stream reads (SSE, long-polls).

A redis.asyncio client is bound to the event loop it first ran on, so a process builds its own
from the broker's sync client (or from APPROVAL_BROKER_REDIS_URL): a single-node client on a
single Redis, a cluster client when the broker's client is a `RedisCluster`. Either has the
impatient client's connect and socket timeouts (`broker.redis.connection`): a stalled Redis costs a
read an error after a bounded wait, never the event loop.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis import asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from broker.redis.connection import async_options, connect_async

AsyncRedis = aredis.Redis | AsyncRedisCluster
_KWARGS = ("host", "port", "db", "username", "password", "path")
_CLUSTER_KWARGS = ("username", "password", "ssl")
CLUSTER_CONNECTIONS = 1000
"""Per node: the process's stream reader holds one per partition it has there, and an event
stream as many while it reads the partitions that rang (the default, 100, is soon reached)."""


def async_client(
    url: str | None, sync: Redis | RedisCluster, *, patient: bool = False
) -> AsyncRedis:
    """A new asyncio client on the Redis (or Redis Cluster) `sync` talks to: by `url` when one
    is given, else with `sync`'s own connection settings; `patient` (a single Redis): with the
    patient client's timeouts and retries (`broker.redis.connection.connect`)."""
    if isinstance(sync, RedisCluster):
        if url:
            return AsyncRedisCluster.from_url(
                url, max_connections=CLUSTER_CONNECTIONS, **_cluster_timeouts()
            )
        node = sync.get_default_node() or sync.get_nodes()[0]
        given: dict[str, Any] = sync.nodes_manager.connection_kwargs
        picked = {k: given[k] for k in _CLUSTER_KWARGS if given.get(k) is not None}
        return AsyncRedisCluster(
            host=node.host,
            port=node.port,
            max_connections=CLUSTER_CONNECTIONS,
            **picked,
            **_cluster_timeouts(),
        )
    if url:
        return connect_async(url, patient=patient)
    kwargs: dict[str, Any] = sync.connection_pool.connection_kwargs
    picked = {k: kwargs[k] for k in _KWARGS if kwargs.get(k) is not None}
    return connect_async(patient=patient, **picked)


def _cluster_timeouts() -> dict[str, Any]:
    """The impatient timeouts for a cluster client (it keeps its own retry across nodes)."""
    options = async_options()
    return {k: options[k] for k in ("socket_connect_timeout", "socket_timeout")}


def socket_timeout(client: AsyncRedis) -> float | None:
    """The client's socket timeout (a blocking read must end well before it)."""
    if isinstance(client, AsyncRedisCluster):
        timeout = client.get_default_node().connection_kwargs.get("socket_timeout")
    else:
        timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
    return float(timeout) if timeout else None
