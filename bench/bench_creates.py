"""CPU per batched create, robust to a loaded machine: the minimum over many short rounds.

`bench_core.py` gives rates beside the XADD ceiling; on a shared machine its CPU per create
moves by half between runs. This runs one client thread, rounds of 20 batches of 100 (copies
of one NewRequest, then 100 distinct ones), and prints for each the least Python and Redis CPU
per create seen over the rounds, with the Redis commands' share (`INFO commandstats`) and the
cost of reading one request back (`parse_request`).
Run: `uv run python bench/bench_creates.py [--rounds 15]`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import timeit

from redis import Redis

from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis
from broker.store.request_hash import parse_request

BATCHES = 20


def redis_cpu(redis: Redis) -> float:
    info = redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    new = NewRequest(
        tool_name="refund",
        args={"order_id": "A-1042", "amount": 180.0, "currency": "EUR"},
        prompt="Refund 180.00 EUR on order A-1042 (customer asked; over the 100 EUR limit).",
        metadata={"customer": "c-17"},
    )
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        redis = Redis.from_url(server.url)
        broker = Broker(redis)
        broker.create_requests([new])
        for mode in ("copies", "distinct"):
            best: dict[str, float] = {}
            for r in range(args.rounds):
                if mode == "copies":
                    batches = [[new] * 100] * BATCHES
                else:
                    batches = [
                        [
                            new.model_copy(
                                update={"args": {**new.args, "order_id": f"{r}-{b}-{i}"}}
                            )
                            for i in range(100)
                        ]
                        for b in range(BATCHES)
                    ]
                redis.config_resetstat()
                py0, r0 = time.process_time(), redis_cpu(redis)
                for batch in batches:
                    broker.create_requests(batch)
                n = BATCHES * 100
                seen = {
                    "python": (time.process_time() - py0) / n * 1e6,
                    "redis": (redis_cpu(redis) - r0) / n * 1e6,
                }
                for name, stats in redis.info("commandstats").items():
                    seen[name.removeprefix("cmdstat_")] = stats["usec"] / n
                for name, value in seen.items():
                    best[name] = min(best.get(name, value), value)
            inner = ", ".join(
                f"{name} {best[name]:.1f}" for name in ("zadd", "hset", "xadd") if name in best
            )
            print(
                f"batches of 100 {mode:8s}: python {best['python']:5.1f} us, redis"
                f" {best['redis']:5.1f} us per create (EVALSHA {best.get('evalsha', 0):.1f};"
                f" inside it {inner}); least of {args.rounds} rounds",
                flush=True,
            )
        made = broker.create_request(new)
        raw = redis.hgetall(broker.keys.request(made.id))
        reads = timeit.repeat(lambda: parse_request(raw), number=2000, repeat=args.rounds)
        print(f"parse_request (a standalone approval): {min(reads) / 2000 * 1e6:5.1f} us")


if __name__ == "__main__":
    main()
