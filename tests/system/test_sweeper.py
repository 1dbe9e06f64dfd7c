"""Expiry sweeps: escalation along named handler queues, time-outs, and racing sweepers."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.domain.config import parse_config
from broker.domain.models import NewRequest, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.store.sweeping import SweepBatch
from tests.support.backends import (  # noqa: F401 - redis, broker, api_broker on both backends
    on_backend,
    on_backend_api_broker,
    on_backend_broker,
    stream_entries,
)
from tests.support.waiting import wait_for
from workers.sweeper import sweep_due, sweep_forever

CHAIN = {
    "queues": {
        "default": {"timeout_s": 0.3, "escalate_to": "leads"},
        "leads": {"timeout_s": 0.3, "escalate_to": "managers"},
        "managers": {"timeout_s": 0.3},
    }
}


def events(broker: Broker, queue: str) -> list[tuple[str, str]]:
    return [
        (f[b"type"].decode(), f.get(b"to", b"").decode()) for _, f in stream_entries(broker, queue)
    ]


@pytest.fixture
def chain_broker(make_broker_on: Callable[..., Broker]) -> Broker:
    return make_broker_on(parse_config(CHAIN))


def test_request_passes_two_queues_then_times_out_and_resumes_once(chain_broker: Broker):
    broker = chain_broker
    broker.create_run("refunds", "go", run_id="run1")
    [request] = broker.create_round(
        "run1", 1, [NewRequest(tool_name="refund", args={"amount": 500})]
    )
    stop = threading.Event()
    sweeper = threading.Thread(target=sweep_forever, args=(broker, stop), kwargs={"interval": 0.05})
    sweeper.start()
    try:
        done = wait_for(
            lambda: (r := broker.get_request(request.id)).status is Status.timed_out and r
        )
    finally:
        stop.set()
        sweeper.join()
    assert done.queue == "managers"
    assert [(h.from_queue, h.to_queue, h.by) for h in done.history] == [
        ("default", "leads", "sweeper"),
        ("leads", "managers", "sweeper"),
    ]
    assert done.decision.outcome.value == "timed_out"
    assert done.decision.reason.startswith("No one answered within ")
    assert events(broker, "default") == [
        ("approval.requested", ""),
        ("approval.escalated", "leads"),
    ]
    assert events(broker, "leads") == [
        ("approval.escalated", "leads"),
        ("approval.escalated", "managers"),
    ]
    assert events(broker, "managers") == [
        ("approval.escalated", "managers"),
        ("approval.timed_out", ""),
    ]
    outbox = broker.redis.xrange(broker.keys.of_run("run1").resumes)
    assert [(f[b"run_id"], f[b"round"]) for _, f in outbox] == [(b"run1", b"1")]
    assert broker.get_run("run1").status.value == "queued"


def test_own_timeout_wins_in_first_queue_only(chain_broker: Broker):
    broker = chain_broker
    request = broker.create_request(NewRequest(tool_name="t", timeout_s=3600))
    assert (request.expires_at - request.created_at).total_seconds() == pytest.approx(
        3600, abs=0.01
    )
    assert sweep_due(broker, now=time.time() + 10) == []
    later = time.time() + 3601
    [moved] = sweep_due(broker, now=later)
    assert (moved.from_queue, moved.to_queue, moved.action) == ("default", "leads", "escalated")
    stored = broker.get_request(request.id)
    assert stored.expires_at.timestamp() == pytest.approx(later + 0.3, abs=1e-3)  # leads' own


def test_sweep_leaves_requests_not_yet_due(chain_broker: Broker):
    broker = chain_broker
    soon = broker.create_request(NewRequest(tool_name="soon", timeout_s=1))
    later = broker.create_request(NewRequest(tool_name="later", timeout_s=100))
    results = sweep_due(broker, now=time.time() + 5)
    assert [r.request_id for r in results] == [soon.id]
    assert broker.get_request(later.id).queue == "default"


def _sweep_in_process(
    env: dict[str, str],
    at: float,
    ready: multiprocessing.synchronize.Event,
    go: multiprocessing.synchronize.Event,
    out: multiprocessing.Queue,
) -> None:
    """Child: import and connect first, then wait for the start signal, so the three race."""
    os.environ.update(env)  # the test's backend: a single Redis or the cluster
    broker = Broker.from_settings(Settings(key_prefix="t:"), parse_config(CHAIN))
    broker.redis.ping()
    ready.set()
    go.wait(30)
    out.put([(r.request_id, r.action) for r in sweep_due(broker, now=at, batch=20)])


def test_three_sweeper_processes_handle_each_due_request_once(
    chain_broker: Broker, backend_env: dict[str, str]
):
    broker = chain_broker
    n = 1500
    for i in range(0, n, 100):
        queue = ["default", "leads", "managers"][(i // 100) % 3]
        broker.create_requests(
            [NewRequest(tool_name="t", args={"i": i + j}, queue=queue) for j in range(100)]
        )
    at = time.time() + 1  # everything is due then, nothing after it moved
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(3)]
    procs = [
        ctx.Process(target=_sweep_in_process, args=(backend_env, at, ready, go, out))
        for ready in readies
    ]
    for p in procs:
        p.start()
    try:
        for ready in readies:
            assert ready.wait(60), "a sweeper process never got ready"
        go.set()
        per_process = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert all(per_process), [len(r) for r in per_process]  # each one really took part
    results = [item for handled in per_process for item in handled]
    ids = [rid for rid, _ in results]
    assert len(ids) == n and len(set(ids)) == n
    assert sum(a == "timed_out" for _, a in results) == n // 3
    for queue in ("default", "leads", "managers"):
        types = [t for t, _ in events(broker, queue)]
        assert types.count("approval.timed_out") == (n // 3 if queue == "managers" else 0)
    assert all(broker.redis.zcount(k.expiry, "-inf", at) == 0 for k in broker.keys.parts())


def test_sweeper_keeps_going_after_redis_errors(
    chain_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = chain_broker
    request = broker.create_request(NewRequest(tool_name="t"))  # due in 0.3 s
    real_sweep = broker.sweeping.sweep_batch
    outage = {"left": 2}

    def flaky_sweep(**kwargs: Any) -> SweepBatch:
        if outage["left"]:
            outage["left"] -= 1
            raise RedisConnectionError("Redis is loading the dataset in memory")
        return real_sweep(**kwargs)

    monkeypatch.setattr(broker.sweeping, "sweep_batch", flaky_sweep)
    stop = threading.Event()
    sweeper = threading.Thread(
        target=sweep_forever,
        args=(broker, stop),
        kwargs={"interval": 0.05, "error_pause": 0.05},
    )
    sweeper.start()
    try:
        wait_for(lambda: broker.get_request(request.id).queue == "leads")
    finally:
        stop.set()
        sweeper.join(10)
    assert outage["left"] == 0 and not sweeper.is_alive()


def test_sweeper_role_stops_cleanly_on_sigterm(backend_env: dict[str, str], tmp_path: Path) -> None:
    env = {
        **os.environ,
        **backend_env,
        "APPROVAL_BROKER_KEY_PREFIX": "t:",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "sweeper.log"
    with log_path.open("w") as log:
        cli = Path(sys.executable).parent / "approval-broker"
        process = subprocess.Popen(
            [str(cli), "sweeper"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_for(lambda: "sweeper watching" in log_path.read_text(), timeout=30)
            process.send_signal(signal.SIGTERM)
            assert process.wait(10) == 0  # finished its sweep and left, not killed mid-step
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
