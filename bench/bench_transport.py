"""What one Redis round trip costs over loopback TCP and over the embedded Redis's Unix socket.

    uv run python bench/bench_transport.py [--n 20000] [--repeats 5] [--batch 1,8]

The e2e bench's processes make about 1.5-2 round trips per approval cycle each way; this
measures the transport alone, where a loaded machine moves it least: CPU µs per round trip of
the client (this process, one thread) and of Redis (`INFO cpu`), for a batch of `--batch`
small commands (HGET of a 10-field hash) sent as one redis-py pipeline (hiredis parser), as the
notifier sends its batches. TCP and Unix runs
alternate, `--repeats` of each; the medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.redis.embedded import EmbeddedRedis  # noqa: E402


def redis_cpu(client: Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def one_run(url: str, monitor: Redis, n: int, batch: int) -> tuple[float, float]:
    """(client µs, Redis µs) per round trip of `batch` HGETs over `url`."""
    client = Redis.from_url(url)
    fields = [f"f{i % 10}" for i in range(batch)]

    def round_trip() -> None:
        pipe = client.pipeline(transaction=False)
        for name in fields:
            pipe.hget("bench:h", name)
        pipe.execute()

    for _ in range(200):  # connect and warm up
        round_trip()
    redis_before, cpu_before = redis_cpu(monitor), time.process_time()
    for _ in range(n):
        round_trip()
    cpu = time.process_time() - cpu_before
    redis = redis_cpu(monitor) - redis_before
    client.close()
    return cpu / n * 1e6, redis / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="round trips per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each transport")
    parser.add_argument("--batch", default="1,8", help="commands per round trip, comma-separated")
    opts = parser.parse_args()
    batches = [int(b) for b in opts.batch.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        with EmbeddedRedis(Path(tmp) / "redis") as server:
            if server.unix_url is None:
                raise SystemExit(f"{server.data_dir} is too long a path for a Unix socket")
            urls = {"tcp": server.url, "unix": server.unix_url}
            monitor = Redis.from_url(server.unix_url)
            monitor.hset("bench:h", mapping={f"f{i}": "x" * 40 for i in range(10)})
            print(f"{opts.n} round trips per run, {opts.repeats} runs of each, alternating")
            print("commands per round trip | transport | client µs per round trip | Redis µs")
            print("|---|---|---|---|")
            for batch in batches:
                seen: dict[str, list[tuple[float, float]]] = {"tcp": [], "unix": []}
                for _ in range(opts.repeats):
                    for name, url in urls.items():
                        seen[name].append(one_run(url, monitor, opts.n, batch))
                for name, runs in seen.items():
                    client = statistics.median(c for c, _ in runs)
                    redis = statistics.median(r for _, r in runs)
                    print(f"| {batch} | {name} | {client:.1f} | {redis:.1f} |", flush=True)
            monitor.close()


if __name__ == "__main__":
    main()
