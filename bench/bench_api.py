"""Benchmark the reply API: decisions/s over HTTP, and decision -> resume job enqueued latency.

Starts an embedded Redis, `approval-broker api` and `approval-broker resumer` as subprocesses,
registers one-request rounds of many runs, then decides them over HTTP:

1. at a steady rate (default 100/s), measuring for each decision the time from the client
   sending it to the resume job being enqueued on RQ by the resumer (RQ's `enqueued_at`), and
   the HTTP round trip;
2. as fast as a few client threads can, reporting decisions/s.

Usage: uv run python bench/bench_api.py [--rate 100] [--seconds 10] [--burst 2000] [--clients 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from benchlib import enqueued_at, make_rounds, pct
from redis import Redis

from broker.auth import hash_token
from broker.client import Broker
from broker.config import load_config
from broker.redis_server import EmbeddedRedis
from broker.runs import resume_job_id

TOKEN = "bench-token"
CONFIG = f"""
[queues.default]
channels = ["inbox"]
timeout_s = 3600

[approvers.bench]
token_sha256 = "{hash_token(TOKEN)}"
roles = ["finance"]
"""
CLI = [sys.executable, "-c", "from approval_broker.cli import main; main()"]


def start_role(
    args: list[str], env: dict[str, str], ready: str
) -> tuple[subprocess.Popen[str], str]:
    """Start a CLI role and wait for the line that says it is ready."""
    proc = subprocess.Popen(
        [*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"{args[0]} exited before it was ready")
        if ready in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
            return proc, line.strip()
    raise SystemExit(f"{args[0]} was not ready within 30 s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc; 0.0 elsewhere).

    CPU per decision in the API process is the figure that holds on a shared, loaded machine,
    where decisions/s mostly measures the neighbours.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decide_all(
    base_url: str, ids: list[str], clients: int, when: Callable[[int], float] | None
) -> tuple[dict[str, float], list[float], float]:
    """POST an approval for every id with `clients` threads; `when(i)` paces them (None: ASAP).

    Returns the wall time each decision was sent, the HTTP round trips, and the elapsed time.
    """
    sent: dict[str, float] = {}
    rtts: list[float] = []
    lock = threading.Lock()
    cursor = iter(range(len(ids)))
    failures: list[str] = []

    def worker() -> None:
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            http.get("/healthz")
            while True:
                with lock:
                    i = next(cursor, None)
                if i is None:
                    return
                if when is not None:
                    delay = when(i) - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                wall, t0 = time.time(), time.perf_counter()
                resp = http.post(f"/v1/requests/{ids[i]}/decision", json={"outcome": "approved"})
                rtt = time.perf_counter() - t0
                with lock:
                    sent[ids[i]] = wall
                    rtts.append(rtt)
                    if resp.status_code != 200:
                        failures.append(f"{resp.status_code} {resp.text[:200]}")

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise SystemExit(f"{len(failures)} decisions failed, e.g. {failures[0]}")
    return sent, rtts, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0, help="steady decisions per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the steady phase")
    parser.add_argument("--burst", type=int, default=2000, help="decisions in the fast phase")
    parser.add_argument("--clients", type=int, default=8, help="client threads, fast phase")
    opts = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as server:
        config_path = Path(tmp) / "bench.toml"
        config_path.write_text(CONFIG)
        env = {
            **os.environ,
            "APPROVAL_BROKER_REDIS_URL": server.url,
            "APPROVAL_BROKER_CONFIG": str(config_path),
            "APPROVAL_BROKER_DATA_DIR": tmp,
        }
        redis = Redis.from_url(server.url)
        broker = Broker(redis, load_config(config_path))
        api, line = start_role(["api", "--port", "0"], env, "API listening on")
        base_url = line.split("API listening on ", 1)[1]
        resumer, _ = start_role(["resumer"], env, "resumer ready")
        try:
            n = int(opts.rate * opts.seconds)
            ids = make_rounds(broker, n, "steady")
            t0 = time.perf_counter() + 0.2
            sent, rtts, elapsed = decide_all(base_url, ids, 4, lambda i: t0 + i / opts.rate)
            jobs = {rid: resume_job_id(rid.split(".")[0], 1) for rid in ids}
            at = enqueued_at(redis, list(jobs.values()))
            lat = [(at[jobs[rid]] - sent[rid]) * 1000 for rid in ids]
            print(
                f"steady phase: {n} decisions at {n / elapsed:.0f}/s over HTTP (target {opts.rate:.0f}/s)"
            )
            print(
                "  decision sent -> resume job enqueued (resumer, RQ enqueued_at): "
                f"p50 {pct(lat, 0.5):.1f} ms, p99 {pct(lat, 0.99):.1f} ms, max {max(lat):.1f} ms"
            )
            rtt_ms = [r * 1000 for r in rtts]
            print(
                f"  HTTP round trip of a decision: p50 {pct(rtt_ms, 0.5):.1f} ms, "
                f"p99 {pct(rtt_ms, 0.99):.1f} ms, mean {statistics.fmean(rtt_ms):.1f} ms"
            )
            print(f"  target p99 < 20 ms at 100/s: {'met' if pct(lat, 0.99) < 20 else 'NOT met'}")

            ids = make_rounds(broker, opts.burst, "burst")
            cpu0 = cpu_seconds(api.pid)
            _, rtts, elapsed = decide_all(base_url, ids, opts.clients, None)
            cpu_us = (cpu_seconds(api.pid) - cpu0) / opts.burst * 1e6
            rtt_ms = [r * 1000 for r in rtts]
            print(
                f"fast phase: {opts.burst} decisions with {opts.clients} clients in {elapsed:.2f} s: "
                f"{opts.burst / elapsed:.0f} decisions/s "
                f"(HTTP p50 {pct(rtt_ms, 0.5):.1f} ms, p99 {pct(rtt_ms, 0.99):.1f} ms)"
            )
            if cpu_us:
                print(
                    f"  API process CPU per decision: {cpu_us:.0f} us"
                    f" (one core's worth: {1e6 / cpu_us:.0f} decisions/s)"
                )
            print(f"machine: {os.cpu_count()} CPUs, one uvicorn process, embedded Redis, loopback")
        finally:
            for proc in (api, resumer):
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            redis.close()


if __name__ == "__main__":
    main()
