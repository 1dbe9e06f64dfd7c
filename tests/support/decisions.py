"""Decision helpers: a request's state at a glance, and racing deciders on threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from redis import Redis

from broker.redis.cluster import WAIT_MARKER
from tests.support.backends import on_backend, on_backend_broker, single_only  # noqa: F401 - redis and broker on both backends


def snapshot(redis: Redis) -> dict[bytes, object]:
    """Every key with its type and content: to prove a refused call wrote nothing."""
    out: dict[bytes, object] = {}
    for key in redis.scan_iter():
        if key.endswith(WAIT_MARKER.encode()):
            continue  # a cluster's WAIT marker (`broker.redis.cluster`): no state, gone in seconds
        kind = redis.type(key)
        if kind == b"hash":
            out[key] = redis.hgetall(key)
        elif kind == b"zset":
            out[key] = redis.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":
            out[key] = redis.xrange(key)
        elif kind == b"set":
            out[key] = redis.smembers(key)
        elif kind == b"list":
            out[key] = redis.lrange(key, 0, -1)
        else:
            out[key] = redis.get(key)
    return out


def race(n: int, fn) -> list:
    """Run fn(i) in n threads released at the same moment; return results or exceptions."""
    barrier = threading.Barrier(n)

    def go(i: int):
        barrier.wait()
        try:
            return fn(i)
        except Exception as exc:  # noqa: BLE001 - the race's losers are the point
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))
