"""Core broker throughput on the embedded Redis, beside the raw Redis ceiling measured in the same run.

Prints: raw pipelined XADD/s (the ceiling), requests created/s, decisions/s, and Redis memory per
pending request. Run: `uv run python bench/bench_core.py [--n 20000]`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from benchlib import raw_xadd_per_s
from redis import Redis

from broker.client import Broker
from broker.models import Decision, NewRequest
from broker.redis_server import EmbeddedRedis


def timed(n: int, threads: int, fn) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, range(n)))
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000, help="requests per measurement")
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        redis = Redis.from_url(server.url, max_connections=64)
        broker = Broker(redis)
        print(
            f"embedded Redis at {server.url}, {args.n} requests, {args.threads} client threads",
            flush=True,
        )

        ceiling = raw_xadd_per_s(redis, args.n)
        print(f"raw pipelined XADD/s (ceiling) : {ceiling:10,.0f}", flush=True)

        new = NewRequest(
            tool_name="refund",
            args={"order_id": "A-1042", "amount": 180.0, "currency": "EUR"},
            prompt="Refund 180.00 EUR on order A-1042 (customer asked; over the 100 EUR limit).",
            metadata={"customer": "c-17"},
        )
        ids: list[str] = []
        mem_before = redis.info("memory")["used_memory"]
        single = timed(args.n, 1, lambda _: ids.append(broker.create_request(new).id))
        mem_after = redis.info("memory")["used_memory"]
        print(f"creates/s, 1 thread            : {single:10,.0f}", flush=True)
        threaded = timed(args.n, args.threads, lambda _: ids.append(broker.create_request(new).id))
        print(
            f"creates/s, {args.threads} threads          : {threaded:10,.0f}  ({threaded / ceiling:.0%} of ceiling)"
        )
        batch = [new] * 100
        batched = 100 * timed(
            args.n // 100,
            args.threads,
            lambda _: ids.extend(r.id for r in broker.create_requests(batch)),
        )
        print(
            f"creates/s, batches of 100      : {batched:10,.0f}  ({batched / ceiling:.0%} of ceiling)"
        )
        per_request = (mem_after - mem_before) / args.n
        print(
            f"Redis memory per pending request: {per_request:10,.0f} bytes (hash, expiry and index entries, stream entry)"
        )

        decision = Decision(outcome="approved")
        decided = timed(
            len(ids) // 2,
            args.threads,
            lambda i: broker.decide(ids[i], decision, decided_by="bench"),
        )
        print(f"decisions/s, {args.threads} threads        : {decided:10,.0f}")


if __name__ == "__main__":
    main()
