"""A real `approval-broker worker` process refuses a receipt that no longer proves the call.

The run is started and paused for approval, decided through the broker, and then the decision
is changed the way someone with write access to Redis could: the receipt's signature altered,
or (with `[receipts] recheck_roles`) the approver removed from the config the worker starts
with. The worker resumes the run; the tool does not run, and the model is told so.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import Decision, RunStatus
from broker.domain.receipts import REFUSED_TEXT
from broker.facade import Broker
from broker.runs.starting import enqueue_resume, start_run
from tests.support.agents import recorder_for
from tests.support.receipts import key_file
from tests.support.waiting import wait_for
from tests.support.worker_process import WorkerProcess

PREFIX = "t:"
BASE = """
[queues.default]
channels = ["inbox"]

[agents.refund]
path = "tests.support.slot_agents:refund_agent"
deps = "tests.support.agents:make_recorder"
live_wait_s = 0  # the round resumes on whichever worker runs then, not in the job that paused

[receipts]
key_file = "{key}"
recheck_roles = true
"""
ANN = """
[approvers.ann]
roles = ["finance"]
"""
FINAL = (RunStatus.finished, RunStatus.failed)

StartWorker = Callable[[str], WorkerProcess]


@pytest.fixture
def fleet(redis: Redis, redis_url: str, tmp_path: Path) -> Iterator[tuple[Path, StartWorker]]:
    key = key_file(tmp_path)
    config_path = tmp_path / "receipts.toml"
    started: list[WorkerProcess] = []

    def start(config_text: str) -> WorkerProcess:
        config_path.write_text(config_text)
        env = {
            **os.environ,
            "APPROVAL_BROKER_REDIS_URL": redis_url,
            "APPROVAL_BROKER_CONFIG": str(config_path),
            "APPROVAL_BROKER_KEY_PREFIX": PREFIX,
            "PYTHONUNBUFFERED": "1",
        }
        worker = WorkerProcess(env, tmp_path / "worker.log")
        worker.wait_ready(seen=len(started))
        started.append(worker)
        return worker

    try:
        yield key, start
    finally:
        for worker in started:
            worker.stop()


def _broker(redis: Redis, key: Path) -> Broker:
    return Broker(redis, parse_config(tomllib.loads(BASE.format(key=key) + ANN)), prefix=PREFIX)


def _approved_run(broker: Broker) -> tuple[str, str]:
    """A refund run started, paused by the worker, and approved by ann: (run id, request id)."""
    run = start_run(broker, "refund", "Refund A1.")
    wait_for(lambda: broker.get_run(run.id).status is RunStatus.waiting, timeout=60)
    rid = broker.get_run(run.id).pending[0]
    broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
    return run.id, rid


def _resumed(broker: Broker, run_id: str) -> RunStatus:
    enqueue_resume(broker, run_id, 1)
    wait_for(lambda: broker.get_run(run_id).status in FINAL, timeout=60)
    return broker.get_run(run_id).status


def test_a_fleet_run_whose_receipt_was_tampered_in_redis_does_not_run_its_tool(
    redis: Redis, fleet: tuple[Path, StartWorker]
) -> None:
    key, start = fleet
    broker = _broker(redis, key)
    start(BASE.format(key=key) + ANN)
    run_id, rid = _approved_run(broker)
    stored = json.loads(redis.hget(broker.keys.request(rid), "decision"))
    head, body, sig = stored["receipt"].split(".")
    stored["receipt"] = f"{head}.{body}.{'B' if sig[0] != 'B' else 'C'}{sig[1:]}"
    redis.hset(broker.keys.request(rid), "decision", json.dumps(stored))
    assert _resumed(broker, run_id) is RunStatus.finished
    assert recorder_for(redis, PREFIX).all() == []  # the refund never ran
    assert REFUSED_TEXT in broker.load_messages(run_id).decode()
    assert broker.counts().get("receipt_refused:bad_signature") == 1


def test_a_run_approved_by_someone_since_removed_from_config_does_not_run(
    redis: Redis, fleet: tuple[Path, StartWorker]
) -> None:
    key, start = fleet
    broker = _broker(redis, key)
    worker = start(BASE.format(key=key) + ANN)
    run_id, rid = _approved_run(broker)
    worker.stop()
    start(BASE.format(key=key))  # ann is no longer an approver
    assert _resumed(broker, run_id) is RunStatus.finished
    assert recorder_for(redis, PREFIX).all() == []
    assert broker.counts().get("receipt_refused:approver_revoked") == 1
    history = [h.event for h in broker.get_request(rid).history]
    assert history[-1] == "receipt_refused"
