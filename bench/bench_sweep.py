"""Sweep time for 1,000 due requests among 10k, 100k and 1M pending: it should stay flat.

Also reports how late the sweeper loop handles a due request (time from expiry to outcome).
Run: `uv run python bench/bench_sweep.py [--sizes 10000,100000,1000000] [--audit off]`. The
audit trail is on by default, as in a deployment; each swept request appends an entry to it
(a SHA-256 in Redis's Lua), which is most of the sweep's time (`--audit off` shows the rest).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time

from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import NewRequest, Status
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis
from workers.sweeper import sweep_due, sweep_forever

CONFIG = {
    "queues": {
        "default": {"timeout_s": 3600, "escalate_to": "managers"},
        "managers": {"timeout_s": 3600},
    }
}


def fill(broker: Broker, count: int, timeout_s: float) -> None:
    new = NewRequest(
        tool_name="refund", args={"order_id": "A-1", "amount": 180}, timeout_s=timeout_s
    )
    for i in range(0, count, 500):
        broker.create_requests([new] * min(500, count - i))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--due", type=int, default=1000)
    parser.add_argument("--audit", choices=["on", "off"], default="on", help="the audit trail")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp) as server:
        config = parse_config({**CONFIG, "audit": {"enabled": args.audit == "on"}})
        broker = Broker(Redis.from_url(server.url), config)
        print(f"{'pending':>10} | {'due':>5} | {'sweep ms':>9} | {'per due request µs':>18}")
        print(f"{'-' * 10}-+-{'-' * 5}-+-{'-' * 9}-+-{'-' * 18}")
        filled = 0
        for size in sizes:
            print(f"filling to {size:,} pending ...", file=sys.stderr, flush=True)
            fill(broker, size - filled - args.due, 3600)
            fill(broker, args.due, 1)  # once swept, these move on to `managers` with a fresh hour
            start = time.perf_counter()
            done = sweep_due(broker, now=time.time() + 5)
            ms = (time.perf_counter() - start) * 1000
            assert len(done) == args.due, len(done)
            print(f"{size:>10,} | {len(done):>5} | {ms:>9.1f} | {ms * 1000 / len(done):>18.1f}")
            filled = size

        # lateness of the loop: requests due in 0.5 s, a sweeper thread with the default interval
        stop = threading.Event()
        thread = threading.Thread(target=sweep_forever, args=(broker, stop))
        thread.start()
        probes = [
            broker.create_request(NewRequest(tool_name="p", timeout_s=0.5, queue="managers"))
            for _ in range(20)
        ]
        late: list[float] = []
        for p in probes:
            while (r := broker.get_request(p.id)).status is Status.pending:
                time.sleep(0.005)
            late.append(r.decision.decided_at.timestamp() - p.expires_at.timestamp())
        stop.set()
        thread.join()
        print(
            f"sweeper loop lateness over {len(late)} requests: max {max(late) * 1000:.1f} ms, mean {sum(late) / len(late) * 1000:.1f} ms"
        )


if __name__ == "__main__":
    main()
