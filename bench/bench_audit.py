"""The cost of the audit trail per decision: µs and Redis memory per request, with and without.

Each request is created (create.lua) and decided (decide.lua) by a person, as one approval's
life on a fleet (µs by the wall clock, and inside Redis from `INFO commandstats`, which a
loaded machine disturbs less); with the trail on, each step also appends its entry (a pure-Lua SHA-256 over
the entry and the previous hash, an XADD and an HSET of the chain's head). Both sides run on
the same embedded Redis, one after the other, each on a flushed database. Printed, not asserted.
Also prints the cost of the Lua SHA-256 alone (one 250-byte entry).

    uv run python bench/bench_audit.py [--n 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis
from broker.store.scripts import source


def used_memory(redis: Redis) -> int:
    return int(redis.info("memory")["used_memory"])


def script_usec(redis: Redis) -> float:
    """µs Redis spent in scripts (EVALSHA and EVAL) since the last CONFIG RESETSTAT."""
    stats = redis.info("commandstats")
    return float(sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "eval")))


def one_side(redis: Redis, n: int, *, audit: bool) -> tuple[float, ...]:
    """µs per create and per decision (wall clock, then inside Redis), and bytes of Redis
    memory per request (after both)."""
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
    after = used_memory(redis)
    return (
        (created - start) / n * 1e6,
        (decided - created) / n * 1e6,
        in_create / n,
        in_decide / n,
        (after - before) / n,
    )


def sha256_cost(redis: Redis, rounds: int = 200) -> float:
    """µs of one Lua SHA-256 of a 250-byte entry, timed inside Redis (no round trip)."""
    lib = source("audit").split("\nlocal A = ")[0]
    script = redis.register_script(
        lib + "\nlocal t = redis.call('TIME') local s = t[1] * 1e6 + t[2]"
        "\nfor i = 1, tonumber(ARGV[1]) do sha256(string.rep('x', 250) .. i) end"
        "\nt = redis.call('TIME') return tostring(t[1] * 1e6 + t[2] - s)"
    )
    return float(script(args=[rounds])) / rounds


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
            sha = sha256_cost(redis)
        finally:
            server.close()
    print(f"requests: {opts.n}, each created then approved by a person")
    head = ("create µs", "decide µs", "in Redis", "in Redis", "bytes/request")
    print(f"{'':>11} {head[0]:>10} {head[1]:>10} {'create µs':>10} {'decide µs':>10} {head[4]:>14}")
    print(f"{'':>11} {'(wall)':>10} {'(wall)':>10} {'(Redis)':>10} {'(Redis)':>10}")
    for name, side in (("audit off", off), ("audit on", on)):
        print(f"{name:>11} " + " ".join(f"{v:>10.0f}" for v in side[:4]) + f" {side[4]:>14.0f}")
    diff = [b - a for a, b in zip(off, on, strict=True)]
    print(
        f"{'difference':>11} " + " ".join(f"{v:>+10.0f}" for v in diff[:4]) + f" {diff[4]:>+14.0f}"
    )
    print(f"Lua SHA-256 of one 250-byte entry, inside Redis: {sha:.0f} µs")


if __name__ == "__main__":
    main()
