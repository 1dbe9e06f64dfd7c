"""Pieces the bench scripts share: the raw Redis ceiling, waiting rounds, percentiles, RQ times,
roles started as subprocesses on an embedded Redis, their CPU and Redis round trips."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path

from redis import Redis
from rq.job import Job
from rq.serializers import JSONSerializer

from broker.domain.config import load_config
from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis


def raw_xadd_per_s(redis: Redis, n: int, batch: int = 1000) -> float:
    """Pipelined XADDs per second from one client: what Redis itself allows here (the ceiling)."""
    start = time.perf_counter()
    for i in range(0, n, batch):
        pipe = redis.pipeline(transaction=False)
        for j in range(batch):
            pipe.xadd("bench:raw", {"type": "approval.requested", "request_id": f"r{i + j}"})
        pipe.execute()
    rate = n / (time.perf_counter() - start)
    redis.delete("bench:raw")
    return rate


def make_rounds(broker: Broker, n: int, tag: str) -> list[str]:
    """n runs, each waiting on one request in round 1 (what an agent worker would register);
    returns the request ids."""
    ids = []
    for i in range(n):
        run = broker.create_run("bench", "go", run_id=f"run_{tag}_{i}")
        (req,) = broker.create_round(run.id, 1, [NewRequest(tool_name="refund", args={"i": i})])
        ids.append(req.id)
    return ids


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def enqueued_at(redis: Redis, job_ids: list[str], timeout: float = 60) -> dict[str, float]:
    """Poll until every job exists; returns each one's RQ `enqueued_at` (epoch seconds)."""
    found: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(found) < len(job_ids):
        for jid in job_ids:
            if jid in found:
                continue
            try:
                job = Job.fetch(jid, connection=redis, serializer=JSONSerializer)
            except Exception:  # noqa: BLE001 - not enqueued yet
                continue
            at = job.enqueued_at
            if at is not None:
                found[jid] = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(found)}/{len(job_ids)} jobs were enqueued")
        time.sleep(0.05)
    return found


# ---- roles as subprocesses (bench_api.py, bench_remote.py) ---------------------------------

CLI = [sys.executable, "-c", "from approval_broker.cli import main; main()"]


def start_role(
    args: list[str], env: dict[str, str], ready: str
) -> tuple[subprocess.Popen[str], str]:
    """Start a CLI role and wait for the line that says it is ready (then drain its output)."""
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
    proc.kill()
    raise SystemExit(f"{args[0]} was not ready within 30 s")


def start_api(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`approval-broker api` on a free port; returns the process and its base URL."""
    proc, line = start_role(["api", "--port", "0"], env, "API listening on")
    return proc, line.split("API listening on ", 1)[1]


def stop_roles(*procs: subprocess.Popen[str]) -> None:
    """SIGTERM each role, then SIGKILL what is still there after 10 s."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def bench_site(config: str) -> Iterator[tuple[dict[str, str], Redis, Broker, Path]]:
    """An embedded Redis in a temporary directory with `config` (TOML text) beside it: yields
    the environment a role is started with, a client, a Broker on it and the directory."""
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as server:
        config_path = Path(tmp) / "bench.toml"
        config_path.write_text(config)
        env = {
            **os.environ,
            "APPROVAL_BROKER_REDIS_URL": server.url,
            "APPROVAL_BROKER_CONFIG": str(config_path),
            "APPROVAL_BROKER_DATA_DIR": tmp,
        }
        redis = Redis.from_url(server.url)
        try:
            yield env, redis, Broker(redis, load_config(config_path)), Path(tmp)
        finally:
            redis.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc; 0.0 elsewhere): the figure
    that holds on a shared, loaded machine, where rates mostly measure the neighbours."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_round_trips(redis: Redis) -> int:
    """Round trips every client of `redis` has made so far, as Redis counts them (INFO stats
    `total_reads_processed`: one read per command sent alone or per pipeline; a pipeline larger
    than Redis's read buffer takes a few). The benchmark's own INFO calls count too: one each."""
    return int(redis.info("stats")["total_reads_processed"])
