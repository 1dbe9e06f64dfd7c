"""The cost of the audit trail per decision: µs and Redis memory per request, with and without.

Each request is created (create.lua) and decided (decide.lua) by a person, as one approval's
life on a fleet (µs by the wall clock, and inside Redis from `INFO commandstats`, which a
loaded machine disturbs less); with the trail on, each step also appends its entry (an XADD
and an HSET of the chain's head, read once per step), and sealing then hashes the entries in this process
and stores their hashes (`broker.audit.sealing`, as the sweeper does): its cost per entry is
printed apart, in this process and inside Redis. Both sides run on the same embedded Redis,
one after the other, each on a flushed database; memory is counted after sealing. Printed,
not asserted.

    uv run python bench/bench_audit.py [--n 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from redis import Redis

from broker.audit.trail import AuditTrail
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis


def used_memory(redis: Redis) -> int:
    return int(redis.info("memory")["used_memory"])


def script_usec(redis: Redis) -> float:
    """µs Redis spent in scripts (EVALSHA and EVAL) since the last CONFIG RESETSTAT."""
    stats = redis.info("commandstats")
    return float(sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "eval")))


def all_usec(redis: Redis) -> float:
    """µs Redis spent in every command since the last CONFIG RESETSTAT."""
    return float(sum(v.get("usec", 0) for v in redis.info("commandstats").values()))


def one_side(redis: Redis, n: int, *, audit: bool) -> tuple[float, ...]:
    """µs per create and per decision (wall clock, then inside Redis), bytes of Redis memory
    per request (after both, and sealing), then sealing's µs per entry (in all, inside Redis)
    and the entries sealed."""
    redis.flushdb()
    broker = Broker(redis, parse_config({"audit": {"enabled": audit}}), prefix="b:")
    warm = broker.create_request(NewRequest(tool_name="refund", args={"amount": 1}))
    broker.decide(warm.id, Decision(outcome="approved"), decided_by="alice")
    before = used_memory(redis)
    args = [{"amount": i, "customer": {"id": f"c{i}", "tier": "bronze"}} for i in range(n)]
    redis.config_resetstat()
    start = time.perf_counter()
    ids = [broker.create_request(NewRequest(tool_name="refund", args=a)).id for a in args]
    created = time.perf_counter()
    in_create = script_usec(redis)
    redis.config_resetstat()
    for rid in ids:
        broker.decide(rid, Decision(outcome="approved"), decided_by="alice")
    decided = time.perf_counter()
    in_decide = script_usec(redis)
    redis.config_resetstat()
    sealing = time.perf_counter()
    sealed = AuditTrail(redis, broker.keys).seal()
    seal_wall = time.perf_counter() - sealing
    seal_redis = all_usec(redis)
    after = used_memory(redis)
    return (
        (created - start) / n * 1e6,
        (decided - created) / n * 1e6,
        in_create / n,
        in_decide / n,
        (after - before) / n,
        seal_wall / sealed * 1e6 if sealed else 0.0,
        seal_redis / sealed if sealed else 0.0,
        sealed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        server = EmbeddedRedis(Path(data))
        server.start()
        try:
            redis = Redis.from_url(server.url)
            off = one_side(redis, opts.n, audit=False)
            on = one_side(redis, opts.n, audit=True)
        finally:
            server.close()
    print(f"requests: {opts.n}, each created then approved by a person")
    head = ("create µs", "decide µs", "in Redis", "in Redis", "bytes/request")
    print(f"{'':>11} {head[0]:>10} {head[1]:>10} {'create µs':>10} {'decide µs':>10} {head[4]:>14}")
    print(f"{'':>11} {'(wall)':>10} {'(wall)':>10} {'(Redis)':>10} {'(Redis)':>10}")
    for name, side in (("audit off", off), ("audit on", on)):
        print(f"{name:>11} " + " ".join(f"{v:>10.0f}" for v in side[:4]) + f" {side[4]:>14.0f}")
    diff = [b - a for a, b in zip(off[:5], on[:5], strict=True)]
    print(
        f"{'difference':>11} " + " ".join(f"{v:>+10.0f}" for v in diff[:4]) + f" {diff[4]:>+14.0f}"
    )
    print(
        f"sealing {on[7]} entries (hashed here, stored by seal.lua): {on[5]:.1f} µs per entry"
        f" in all, {on[6]:.1f} µs of it inside Redis"
    )


if __name__ == "__main__":
    main()
