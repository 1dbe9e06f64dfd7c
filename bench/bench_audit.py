"""The cost of the audit trail per decision: µs and Redis memory per request, with and without.

Each request is created (create.lua) and decided (decide.lua) by a person, as one approval's
life on a fleet; with the trail on, each step also appends its entry (a pure-Lua SHA-256 over
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

from broker.client import Broker
from broker.config import parse_config
from broker.models import Decision, NewRequest
from broker.redis_server import EmbeddedRedis
from broker.scripts import source


def used_memory(redis: Redis) -> int:
    return int(redis.info("memory")["used_memory"])


def one_side(redis: Redis, n: int, *, audit: bool) -> tuple[float, float, float]:
    """µs per create, µs per decision, bytes of Redis memory per request (after both)."""
    redis.flushdb()
    broker = Broker(redis, parse_config({"audit": {"enabled": audit}}), prefix="b:")
    warm = broker.create_request(NewRequest(tool_name="refund", args={"amount": 1}))
    broker.decide(warm.id, Decision(outcome="approved"), decided_by="alice")
    before = used_memory(redis)
    args = [{"amount": i, "customer": {"id": f"c{i}", "tier": "bronze"}} for i in range(n)]
    start = time.perf_counter()
    ids = [broker.create_request(NewRequest(tool_name="refund", args=a)).id for a in args]
    created = time.perf_counter()
    for rid in ids:
        broker.decide(rid, Decision(outcome="approved"), decided_by="alice")
    decided = time.perf_counter()
    after = used_memory(redis)
    return (
        (created - start) / n * 1e6,
        (decided - created) / n * 1e6,
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
    print(f"{'':>14} {'create µs':>10} {'decide µs':>10} {'bytes/request':>14}")
    print(f"{'audit off':>14} {off[0]:>10.0f} {off[1]:>10.0f} {off[2]:>14.0f}")
    print(f"{'audit on':>14} {on[0]:>10.0f} {on[1]:>10.0f} {on[2]:>14.0f}")
    print(
        f"{'difference':>14} {on[0] - off[0]:>+10.0f} {on[1] - off[1]:>+10.0f}"
        f" {on[2] - off[2]:>+14.0f}"
    )
    print(f"Lua SHA-256 of one 250-byte entry, inside Redis: {sha:.0f} µs")


if __name__ == "__main__":
    main()
