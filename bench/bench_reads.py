"""Listing time at 10k, 100k and 1M stored requests: a page should cost the same at each size.

Lists a small queue's pending page, a status page (`approved`) and one run's requests (50 each,
the median of 30 reads), and Redis memory per stored pending request with every index.
Run: `uv run python bench/bench_reads.py [--sizes 10000,100000,1000000]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Outcome
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis

CONFIG = {
    "queues": {"default": {"timeout_s": 86400}, "small": {"timeout_s": 86400}},
}
BATCH = 5000
PAGE = 50


def fill(broker: Broker, count: int) -> None:
    new = NewRequest(tool_name="refund", args={"order_id": "A-1", "amount": 180})
    for i in range(0, count, BATCH):
        broker.create_requests([new] * min(BATCH, count - i))


def median_ms(read: Callable[[], object], times: int = 30) -> float:
    took = []
    for _ in range(times):
        start = time.perf_counter()
        read()
        took.append((time.perf_counter() - start) * 1000)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        redis = Redis.from_url(server.url)
        broker = Broker(redis, parse_config(CONFIG))
        base = int(redis.info("memory")["used_memory"])
        small = broker.create_requests(
            [NewRequest(tool_name="wire", queue="small")] * 200
        )  # fmt: skip
        for r in small[:100]:
            broker.decide(r.id, Decision(outcome=Outcome.approved), decided_by="bench")
        broker.create_round("run_bench", 0, [NewRequest(tool_name="refund")] * PAGE)
        reads = {
            "small queue, pending": lambda: broker.list_requests(
                status="pending", queue="small", limit=PAGE
            ),
            "status approved": lambda: broker.list_requests(status="approved", limit=PAGE),
            "one run": lambda: broker.requests.list_page(run_id="run_bench", limit=PAGE),
        }
        print(f"{'stored':>10} | " + " | ".join(f"{n + ' ms':>22}" for n in reads))
        print("-" * 11 + "+" + "+".join("-" * 24 for _ in reads))
        stored, rows = 350, []
        for size in sizes:
            print(f"filling to {size:,} stored requests ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            fill(broker, size - stored)
            print(f"  filled in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            stored = size
            for read in reads.values():  # each read gives a full page
                read()
            ms = [median_ms(read) for read in reads.values()]
            rows.append(ms)
            print(f"{size:>10,} | " + " | ".join(f"{m:>22.2f}" for m in ms))
            used = int(redis.info("memory")["used_memory"]) - base
            print(f"memory per pending request: {used / size:.0f} bytes (at {size:,})")
        if len(rows) >= 2:
            worst = max(last / first for first, last in zip(rows[0], rows[-1], strict=True))
            print(f"largest / smallest size, worst listing: {worst:.2f} x")
            print(f"slowest listing at {sizes[-1]:,}: {max(rows[-1]):.2f} ms")


if __name__ == "__main__":
    main()
