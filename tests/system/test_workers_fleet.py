"""A real `approval-broker worker` process (many runs on one event loop, resumer inside) on a real Redis.

The agent comes from the config (`[agents.refunds]`); the test process only starts runs and
decides, as the API would, and reads the demo ledger the worker process wrote.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from refunds_demo import Ledger

from broker.domain.config import load_config
from broker.domain.models import Decision, RunStatus
from broker.facade import Broker
from broker.runs.starting import start_run, wait_run
from tests.support.agents import recorder_for
from tests.support.waiting import wait_for

CONFIG = """
[queues.default]
channels = ["inbox"]
timeout_s = 600

[queues.managers]
channels = ["inbox"]

[agents.refunds]
path = "refunds_demo:agent"
deps = "refunds_demo:make_deps"
max_rounds = 3

[agents.asker]
path = "tests.support.agents:ask_agent"

[agents.pair]
path = "tests.support.agents:pair_agent"
deps = "tests.support.agents:make_recorder"

[agents.looper]
path = "tests.support.agents:loop_agent"
max_rounds = 1
"""


@pytest.fixture
def fleet_broker(redis: Redis, redis_url: str, tmp_path: Path) -> Iterator[Broker]:
    config_path = tmp_path / "fleet.toml"
    config_path.write_text(CONFIG)
    broker = Broker(redis, load_config(config_path), prefix="t:")
    env = {
        **os.environ,
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_CONFIG": str(config_path),
        "APPROVAL_BROKER_KEY_PREFIX": "t:",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("APPROVAL_BROKER_DEMO_MODEL", None)
    log = (tmp_path / "worker.log").open("w+")
    cli = Path(sys.executable).parent / "approval-broker"
    process = subprocess.Popen(
        [str(cli), "worker"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for(lambda: "worker ready on queue agent-runs" in (tmp_path / "worker.log").read_text(), timeout=30)  # fmt: skip
        yield broker
    finally:
        process.send_signal(signal.SIGTERM)  # RQ's warm shutdown: finish the job, then exit
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_forked_worker_pauses_resumes_and_really_refunds(fleet_broker: Broker) -> None:
    broker = fleet_broker
    ledger = Ledger(broker.redis, broker.keys.prefix)
    approved = start_run(broker, "refunds", "Refund $120 on order A103 because the floor is torn.")
    rejected = start_run(broker, "refunds", "Refund $75 on order A100 because the sole came off.")
    small = start_run(broker, "refunds", "Refund $10 on order A101 because one sock has a hole.")

    waiting = [wait_run(broker, r.id, until=(RunStatus.waiting,), timeout=30) for r in (approved, rejected)]  # fmt: skip
    assert wait_run(broker, small.id, timeout=30).output["refunded"] is True  # under the limit
    assert [r.order_id for r in ledger.all()] == ["A101"]

    [first] = waiting[0].pending
    [second] = waiting[1].pending
    broker.decide(first, Decision(outcome="approved"), decided_by="alice")
    broker.decide(second, Decision(outcome="rejected", reason="Photo needed"), decided_by="bob")

    done = wait_run(broker, approved.id, timeout=30)
    assert done.status is RunStatus.finished, done.error
    assert done.output["refunded"] is True
    refused = wait_run(broker, rejected.id, timeout=30)
    assert refused.output["refunded"] is False
    assert "Photo needed" in refused.output["message"]
    assert sorted((r.order_id, r.amount) for r in ledger.all()) == [("A101", 10.0), ("A103", 120.0)]


def test_forked_worker_answers_questions_waits_for_pairs_and_stops_loops(
    fleet_broker: Broker,
) -> None:
    broker = fleet_broker
    asker = start_run(broker, "asker", "What colour?")
    pair = start_run(broker, "pair", "Email Ann and charge her card.")
    looper = start_run(broker, "looper", "go")
    until_waiting = (RunStatus.waiting,)
    [question] = wait_run(broker, asker.id, until=until_waiting, timeout=30).pending
    email, charge = wait_run(broker, pair.id, until=until_waiting, timeout=30).pending
    [step] = wait_run(broker, looper.id, until=until_waiting, timeout=30).pending

    broker.decide(question, Decision(outcome="answered", answer="teal"), decided_by="a")
    broker.decide(email, Decision(outcome="approved"), decided_by="b")
    broker.decide(step, Decision(outcome="approved"), decided_by="c")

    assert wait_run(broker, asker.id, timeout=30).output == "success: teal (secret seen: False)"
    stopped = wait_run(broker, looper.id, timeout=30)
    assert stopped.status is RunStatus.failed
    assert "(max_rounds = 1)" in (stopped.error or "")
    assert broker.get_run(pair.id).status is RunStatus.waiting  # one of its two calls is open
    assert recorder_for(broker.redis, "t:").all() == []

    broker.decide(charge, Decision(outcome="approved"), decided_by="d")
    finished = wait_run(broker, pair.id, timeout=30)
    assert finished.output == "send_email=success:sent to ann@example.com; charge_card=success:charged 30"  # fmt: skip
    tools = [c["tool"] for c in recorder_for(broker.redis, "t:").all()]
    assert sorted(tools) == ["charge_card", "send_email"]  # each once; they run in parallel
