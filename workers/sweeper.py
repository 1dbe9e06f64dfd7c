"""The sweeper: turns silence into an outcome.

Due requests are found through the expiry ZSET in batches (cost grows with what is due, not with
what is pending). Each batch is one atomic Lua step, so any number of sweepers can run at once
without handling a request twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from redis import Redis

from broker.client import Broker, SweepResult
from broker.config import Config, Settings

BATCH = 200


def sweep_due(broker: Broker, *, now: float | None = None, batch: int = BATCH) -> list[SweepResult]:
    """Handle everything due at `now`, batch after batch, and return what was done."""
    done: list[SweepResult] = []
    while True:
        results = broker.sweep(now=now, limit=batch)
        done.extend(results)
        if len(results) < batch:
            return done


def next_due_in(broker: Broker) -> float | None:
    """Seconds until the earliest pending request expires (negative if overdue), or None."""
    first = broker.redis.zrange(broker.keys.expiry, 0, 0, withscores=True)
    return float(first[0][1]) - time.time() if first else None


def sweep_forever(
    broker: Broker,
    stop: threading.Event,
    *,
    interval: float = 0.25,
    report: Callable[[list[SweepResult]], None] | None = None,
) -> None:
    """Sweep until `stop` is set, waking at the next expiry or every `interval` seconds."""
    while not stop.is_set():
        results = sweep_due(broker)
        if results and report:
            report(results)
        wait = next_due_in(broker)
        stop.wait(interval if wait is None else min(interval, max(wait, 0.0)))


def run_sweeper(settings: Settings, config: Config, *, interval: float = 0.25) -> None:
    """The `approval-broker sweeper` role."""
    broker = Broker(Redis.from_url(settings.redis_url or ""), config, prefix=settings.key_prefix)
    stop = threading.Event()

    def report(results: list[SweepResult]) -> None:
        escalated = sum(r.action == "escalated" for r in results)
        print(f"sweeper: escalated {escalated}, timed out {len(results) - escalated}", flush=True)

    print(f"sweeper watching {len(config.queues)} queue(s) every {interval}s at most", flush=True)
    try:
        sweep_forever(broker, stop, interval=interval, report=report)
    except KeyboardInterrupt:
        stop.set()
