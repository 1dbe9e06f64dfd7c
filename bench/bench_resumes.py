"""Benchmark the resumer: decision -> resume job enqueued latency, and resumes/s at full speed.

Starts an embedded Redis and `approval-broker resumer` as a subprocess, registers one-request
rounds of many runs, then decides them in this process (`Broker.decide`, no HTTP: the figure
is the outbox and the resumer, not the API):

1. at a steady rate (default 100/s): for each decision, the time from just before the decide
   call to RQ's `enqueued_at` of its resume job (the resumer's clock, same machine);
2. at full speed: with the resumer stopped (SIGSTOP), `--burst` rounds are decided, so the
   outbox holds that backlog; the resumer is let go (SIGCONT) and timed until every resume job
   is on RQ's queue: resumes/s, and the resumer's CPU per resume.

Usage: uv run python bench/bench_resumes.py [--rate 100] [--seconds 10] [--burst 5000]
"""

from __future__ import annotations

import argparse
import os
import signal
import time

from benchlib import bench_site, cpu_seconds, enqueued_at, make_rounds, pct, start_role, stop_roles
from redis import Redis

from broker.domain.models import Decision
from broker.facade import Broker
from broker.runs.starting import resume_job_id, run_queue

CONFIG = """
[queues.default]
channels = ["inbox"]
timeout_s = 3600
"""
APPROVED = Decision(outcome="approved")


def job_of(request_id: str) -> str:
    return resume_job_id(request_id.split(".")[0], 1)


def steady(broker: Broker, redis: Redis, ids: list[str], rate: float) -> float:
    """Decide `ids` at `rate`/s; prints the latency to each resume job; returns its p99 (ms)."""
    sent: dict[str, float] = {}
    start = time.monotonic()
    for i, rid in enumerate(ids):
        due = start + i / rate
        while (left := due - time.monotonic()) > 0:
            time.sleep(left)
        sent[rid] = time.time()
        broker.decide(rid, APPROVED, decided_by="bench")
    elapsed = time.monotonic() - start
    at = enqueued_at(redis, [job_of(rid) for rid in ids])
    lat = [(at[job_of(rid)] - sent[rid]) * 1000 for rid in ids]
    p99 = pct(lat, 0.99)
    print(f"steady phase: {len(ids)} decisions at {len(ids) / elapsed:.0f}/s (target {rate:.0f}/s)")
    print(
        "  decision -> resume job enqueued (RQ enqueued_at): "
        f"p50 {pct(lat, 0.5):.2f} ms, p99 {p99:.2f} ms, max {max(lat):.2f} ms"
    )
    print(f"  target p99 < 10 ms at 100/s: {'met' if p99 < 10 else 'NOT met'}")
    return p99


def backlog(broker: Broker, redis: Redis, ids: list[str], resumer_pid: int) -> float:
    """Decide `ids` with the resumer stopped, then time it through the backlog: resumes/s."""
    queue_key = run_queue(broker).key
    before = redis.llen(queue_key)
    os.kill(resumer_pid, signal.SIGSTOP)
    try:
        for rid in ids:
            broker.decide(rid, APPROVED, decided_by="bench")
    finally:
        cpu0 = cpu_seconds(resumer_pid)
        start = time.monotonic()
        os.kill(resumer_pid, signal.SIGCONT)
    want = before + len(ids)
    deadline = start + 300
    while redis.llen(queue_key) < want:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {redis.llen(queue_key) - before}/{len(ids)} resumes in 300 s")
        time.sleep(0.002)
    elapsed = time.monotonic() - start
    cpu = cpu_seconds(resumer_pid) - cpu0
    rate = len(ids) / elapsed
    print(f"full speed: a backlog of {len(ids)} outbox entries resumed in {elapsed:.2f} s:"
          f" {rate:,.0f} resumes/s")  # fmt: skip
    print(f"  resumer CPU per resume: {cpu / len(ids) * 1000:.3f} ms"
          f" (one core's worth: {len(ids) / cpu if cpu else float('inf'):,.0f} resumes/s)")  # fmt: skip
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="steady decisions per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the steady phase")
    parser.add_argument("--burst", type=int, default=5000, help="outbox backlog, full speed")
    opts = parser.parse_args()
    with bench_site(CONFIG) as (env, redis, broker, _):
        resumer, _ = start_role(["resumer"], env, "resumer ready")
        try:
            ids = make_rounds(broker, int(opts.rate * opts.seconds), "steady")
            steady(broker, redis, ids, opts.rate)
            ids = make_rounds(broker, opts.burst, "burst")
            backlog(broker, redis, ids, resumer.pid)
            print(f"machine: {os.cpu_count()} CPUs, embedded Redis, one resumer process;"
                  f" load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        finally:
            stop_roles(resumer)


if __name__ == "__main__":
    main()
