"""Decision helpers: a request's state at a glance, and racing deciders on threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from redis import Redis

from broker.redis.cluster import WAIT_MARKER
from tests.support.backends import on_backend, on_backend_broker, single_only  # noqa: F401 - redis and broker on both backends


def snapshot(redis: Redis) -> dict[bytes, object]:
    """Every key with its type and content: to prove a refused call wrote nothing.

    Pipelined (a scan, then one round trip for the types and one for the contents), so a fuzz
    suite can take one before and after each call."""
    keys = [k for k in redis.scan_iter(count=1000) if not k.endswith(WAIT_MARKER.encode())]
    # (a cluster's WAIT marker, `broker.redis.cluster`: no state, gone in seconds)
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = pipe.execute()
    pipe = redis.pipeline(transaction=False)
    for key, kind in zip(keys, kinds, strict=True):
        if kind == b"hash":
            pipe.hgetall(key)
        elif kind == b"zset":
            pipe.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":
            pipe.xrange(key)
        elif kind == b"set":
            pipe.smembers(key)
        elif kind == b"list":
            pipe.lrange(key, 0, -1)
        else:
            pipe.get(key)
    return dict(zip(keys, pipe.execute(), strict=True))


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
