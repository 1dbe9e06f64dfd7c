"""Pieces the bench scripts share: the raw Redis ceiling, waiting rounds, percentiles, RQ times."""

from __future__ import annotations

import time
from datetime import UTC

from redis import Redis
from rq.job import Job
from rq.serializers import JSONSerializer

from broker.client import Broker
from broker.models import NewRequest


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
