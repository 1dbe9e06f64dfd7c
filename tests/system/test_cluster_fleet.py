"""Issue 19: a fleet on a Redis Cluster holds while masters are SIGKILLed and replicas promoted.

A local cluster (3 masters + 3 replicas, `broker.redis.local_cluster.LocalCluster`) holds the broker's
keys; RQ runs on its own embedded single Redis (APPROVAL_BROKER_RQ_REDIS_URL). The roles are
real OS processes started with APPROVAL_BROKER_REDIS_CLUSTER=1 (`tests/support/fleet_processes.py`):
2 API processes, 2 notifiers, 2 agent workers, a sweeper and the resumer. The test process is
the app (it starts runs of the demo refunds agent) and the people: a webhook receiver approves,
rejects or ignores each request and replies through either API process, recording its intent.

While the runs flow, a master is SIGKILLed at a third of the runs, and at two thirds the replica
that took over from it (so one shard fails over twice, back to the node first killed); each
time the test waits for the promotion, then starts the killed node again (it rejoins as a
replica). At the end (`tests/support/cluster_fleet_checks.py`): every reply the API
acknowledged (HTTP 200) is the recorded outcome, and every outcome is what the receiver meant
(silence -> timed out by the sweeper); each request has one outcome event in its partition's
stream and one at the webhook (no decision doubled); each answered round has one resume job;
every approved call of a finished run ran its tool step once (the demo ledger's attempts);
every run is final (finished, or failed for a listed reason); the outbox is empty in every
partition; no role process died on its own. The counts are printed.

Knobs: APPROVAL_BROKER_CLUSTER_FLEET_RUNS (default 200), APPROVAL_BROKER_CLUSTER_FLEET_KILLS
(default 2).
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis
from refunds_demo import register_demo

from broker.domain.config import load_config
from broker.facade import Broker
from broker.redis.cluster import connect_cluster
from broker.redis.embedded import EmbeddedRedis, free_port
from broker.redis.local_cluster import LocalCluster
from tests.support.cluster_fleet_checks import all_request_ids, check, outbox_left
from tests.support.cluster_fleet_faults import Faults, Tracker, drive, kill_masters, poll_until
from tests.support.fakes.deciding_receiver import DecidingReceiver, mix_policy
from tests.support.fleet_checks import BOT, ENDPOINT, REJECT_REASON, Started
from tests.support.fleet_processes import Fleet

RUNS = int(os.environ.get("APPROVAL_BROKER_CLUSTER_FLEET_RUNS", "200"))
KILLS = int(os.environ.get("APPROVAL_BROKER_CLUSTER_FLEET_KILLS", "2"))
INFLIGHT = 60
MIX = {"approve": 5, "reject": 3, "ignore": 2}
QUEUE_TIMEOUT_S = 4
PREFIX = "cfleet:"
SECRET = "whsec_" + base64.b64encode(b"cluster-fleet-secret-0123456789a").decode()
DRAIN_S = 90.0
TRIMMED = ("notifier-3", "sweeper-2")
"""Of the fleet test's set of roles, these are left out: the machine is small."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    nodes = LocalCluster(tmp_path / "cluster", masters=3).start()
    yield nodes
    nodes.close()


@pytest.fixture
def rq_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "rq").start()
    yield server
    server.close()


def write_config(path: Path, hook_url: str) -> Path:
    path.write_text(
        f"""
[queues.default]
channels = ["webhook:{ENDPOINT}"]
timeout_s = {QUEUE_TIMEOUT_S}

[webhooks.{ENDPOINT}]
url = "{hook_url}"
secret = "{SECRET}"
roles = ["ops"]
max_attempts = 30
backoff_s = 0.05
max_backoff_s = 1.0
timeout_s = 5
"""
    )
    return path


def logged(logs: Path, text: str) -> int:
    """How often the role processes logged `text`."""
    return sum(p.read_text(errors="replace").count(text) for p in logs.glob("*.log"))


def settle(predicate: Callable[[], object], timeout: float, what: str, late: list[str]) -> None:
    """Poll until `predicate` holds; past the deadline note it (the checks then say why)."""
    try:
        poll_until(predicate, timeout, what, threading.Event())
    except AssertionError as exc:
        late.append(f"not settled: {exc}")


@pytest.mark.fleet
@pytest.mark.timeout(600)
def test_a_fleet_on_the_cluster_loses_nothing_acknowledged_when_masters_are_killed(
    cluster: LocalCluster,
    rq_server: EmbeddedRedis,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api_ports = [free_port(), free_port()]
    receiver = DecidingReceiver(
        SECRET,
        [f"http://127.0.0.1:{p}" for p in api_ports],
        endpoint=ENDPOINT,
        policy=mix_policy(MIX, REJECT_REASON),
        decided_by=BOT,
        threads=8,
    ).start()
    config_path = write_config(tmp_path / "fleet.toml", receiver.url("/hook"))
    client = connect_cluster(cluster.url, patient=True)
    rq = Redis.from_url(rq_server.url)
    broker = Broker(client, load_config(config_path), prefix=PREFIX)  # type: ignore[arg-type]
    broker.store.rq = rq
    register_demo(broker)
    env = {
        **os.environ,
        "APPROVAL_BROKER_REDIS_CLUSTER": "1",
        "APPROVAL_BROKER_REDIS_URL": cluster.url,
        "APPROVAL_BROKER_RQ_REDIS_URL": rq_server.url,
        "APPROVAL_BROKER_CONFIG": str(config_path),
        "APPROVAL_BROKER_KEY_PREFIX": PREFIX,
        "APPROVAL_BROKER_ADMIN_TOKEN": "cluster-fleet-admin-token-0123",
        "APPROVAL_BROKER_DATA_DIR": str(tmp_path / "data"),
        "APPROVAL_BROKER_NOTIFIER_CLAIM_IDLE_S": "2",
        "APPROVAL_BROKER_NOTIFIER_BLOCK_MS": "200",
        "APPROVAL_BROKER_NOTIFIER_WORKERS": "4",
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("APPROVAL_BROKER_DEMO_MODEL", "APPROVAL_BROKER_NOTIFIER_NAME"):
        env.pop(name, None)
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Fleet(env, logs, api_ports)
    fleet.members = [m for m in fleet.members if m.name not in TRIMMED]
    tracker = Tracker(broker)
    started: list[Started] = []
    faults = Faults()
    halt = threading.Event()
    times: dict[str, float] = {}
    late: list[str] = []
    at_runs = [RUNS * (k + 1) // (KILLS + 1) for k in range(KILLS)]
    t0 = time.monotonic()
    try:
        fleet.start()
        times["fleet started"] = time.monotonic() - t0
        fleet.run_in_background(random.Random(19), 0)  # supervised; no role kills here
        driver = threading.Thread(
            target=drive, args=(broker, tracker, started, faults, RUNS, INFLIGHT, halt)
        )
        killer = threading.Thread(
            target=kill_masters, args=(cluster, started, at_runs, faults, halt)
        )
        driver.start()
        killer.start()
        driver.join(300)
        times["all runs started"] = time.monotonic() - t0
        killer.join(120)
        times["faults done"] = time.monotonic() - t0
        settle(lambda: not tracker.poll(), DRAIN_S, "every run final", late)
        times["all runs final"] = time.monotonic() - t0
        request_ids = all_request_ids(broker, started)

        def delivered() -> bool:
            return outbox_left(broker) == (0, 0) and all(r in receiver.outcomes for r in request_ids)  # fmt: skip

        settle(delivered, 60, "outcomes delivered and outbox drained", late)
        times["deliveries settled"] = time.monotonic() - t0
    finally:
        halt.set()
        fleet.stop()
        receiver.stop()

    found = check(broker, rq, receiver, started)
    found.counts["faults"] = {
        "masters SIGKILLed": [
            {
                "node": k.node,
                "at run": k.at_run,
                "promoted": k.promoted,
                "promotion s": round(k.promotion_s, 2),
                "rejoin s": round(k.rejoin_s, 2),
            }
            for k in faults.kills
        ],
        "retries seen": {
            "app start_run errors (retried)": len(faults.start_errors),
            "webhook reply retries": receiver.stats().get("reply_retries", 0),
            "role calls retried through a failover": logged(logs, "retrying through a failover"),
            "steps with no replica in time": logged(logs, "no replica acknowledged"),
        },
        "role processes that died on their own": len(fleet.events.self_deaths),
    }
    found.counts["seconds"] = {k: round(v, 1) for k, v in times.items()}
    report = "cluster fleet counts\n" + json.dumps(found.counts, indent=2)
    problems = [*late, *found.problems, *faults.errors, *fleet.events.self_deaths]
    if len(faults.kills) != KILLS:
        problems.append(f"{len(faults.kills)} of {KILLS} master kills happened")
    if problems:
        report += "\nPROBLEMS:\n  " + "\n  ".join(problems)
    (tmp_path / "cluster-fleet-counts.txt").write_text(report + "\n")
    with capsys.disabled():
        print("\n" + report, flush=True)
    client.close()
    rq.close()
    assert not problems, "\n".join(problems)
    assert len(started) == RUNS
