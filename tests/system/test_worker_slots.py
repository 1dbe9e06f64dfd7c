"""One `approval-broker worker` process runs many agent runs at once, and a bad one stays alone.

A real worker process on a real Redis (agents from `tests.support.slot_agents`, loaded by import
path): many slow runs advance together on its one event loop, while a run that raises, one that
hangs past `[workers] run_timeout_s` and one that blocks the loop with `time.sleep` each fail
with their cause in the run (what `GET /v1/runs/{id}` shows), and the others finish. A worker
SIGKILLed with many runs in flight loses none: RQ finds the jobs abandoned, a new worker retries
them, and no tool runs twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis
from rq.registry import StartedJobRegistry

from broker.domain.config import load_config, parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.runs.starting import RUN_QUEUE, start_run
from tests.support.slot_agents import SLOW_S, effects_key
from tests.support.waiting import wait_for
from tests.support.worker_process import WorkerProcess  # noqa: F401

PREFIX = "t:"
CONFIG = """
[queues.default]
channels = ["inbox"]

[workers]
concurrency = 60
run_timeout_s = 10
loop_block_s = 3
abandoned_after_s = 6

[agents.slow]
path = "tests.support.slot_agents:slow_agent"
deps = "tests.support.slot_agents:per_run"

[agents.raising]
path = "tests.support.slot_agents:raising_agent"

[agents.hanging]
path = "tests.support.slot_agents:hanging_agent"

[agents.blocking]
path = "tests.support.slot_agents:blocking_agent"
"""

FINAL = (RunStatus.finished, RunStatus.failed)


@pytest.fixture
def fleet(redis: Redis, redis_url: str, tmp_path: Path) -> Iterator[tuple[Broker, Callable[[], WorkerProcess]]]:  # fmt: skip
    config_path = tmp_path / "slots.toml"
    config_path.write_text(CONFIG)
    broker = Broker(redis, load_config(config_path), prefix=PREFIX)
    env = {
        **os.environ,
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_CONFIG": str(config_path),
        "APPROVAL_BROKER_KEY_PREFIX": PREFIX,
        "PYTHONUNBUFFERED": "1",
    }
    started: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        worker = WorkerProcess(env, tmp_path / "worker.log")
        worker.wait_ready(seen=len(started))
        started.append(worker)
        return worker

    try:
        yield broker, start
    finally:
        for worker in started:
            worker.stop()


def statuses(broker: Broker, run_ids: list[str]) -> list[RunStatus]:
    return [broker.get_run(r).status for r in run_ids]


def all_final(broker: Broker, run_ids: list[str]) -> bool:
    return all(s in FINAL for s in statuses(broker, run_ids))


def effects(broker: Broker, run_id: str) -> int:
    return int(broker.redis.llen(effects_key(PREFIX, run_id)))


def test_one_worker_runs_many_runs_at_once_and_a_raising_hanging_or_blocking_one_fails_alone(
    fleet: tuple[Broker, Callable[[], WorkerProcess]],
) -> None:
    broker, start = fleet
    start()
    slow = [start_run(broker, "slow", f"task {i}").id for i in range(40)]
    raising = start_run(broker, "raising", "go").id
    hanging = start_run(broker, "hanging", "go").id
    blocking = start_run(broker, "blocking", "go").id
    began = time.monotonic()
    wait_for(lambda: all_final(broker, slow), timeout=60)
    took = time.monotonic() - began
    wait_for(lambda: all_final(broker, [raising, hanging, blocking]), timeout=60)

    assert statuses(broker, slow) == [RunStatus.finished] * len(slow)
    assert [effects(broker, r) for r in slow] == [1] * len(slow)
    # 40 runs of two 1 s model calls each, one after the other, would take 80 s: they overlapped
    assert took < 30 * SLOW_S, f"the slow runs took {took:.1f} s: they did not run at once"

    failed = {name: broker.get_run(r) for name, r in [("raising", raising), ("hanging", hanging), ("blocking", blocking)]}  # fmt: skip
    assert {n: r.status for n, r in failed.items()} == dict.fromkeys(failed, RunStatus.failed)
    assert "ValueError: the model's answer made no sense" in (failed["raising"].error or "")
    assert "run_timeout_s = 10 s" in (failed["hanging"].error or "")
    assert "blocked the worker's event loop" in (failed["blocking"].error or "")


def test_a_worker_killed_with_many_runs_in_flight_loses_none_and_runs_no_tool_twice(
    fleet: tuple[Broker, Callable[[], WorkerProcess]],
) -> None:
    broker, start = fleet
    first = start()
    runs = [start_run(broker, "slow", f"task {i}").id for i in range(30)]
    wait_for(lambda: statuses(broker, runs).count(RunStatus.running) == len(runs), timeout=30)
    rq_redis = broker.store.rq_redis
    started = StartedJobRegistry(RUN_QUEUE, connection=rq_redis)

    def expiries() -> list[float]:
        return [score for _, score in rq_redis.zrange(started.key, 0, -1, withscores=True)]

    # it beats with the configured TTL (`abandoned_after_s = 6`), not RQ's default
    first_seen = expiries()
    assert len(first_seen) == len(runs) and max(first_seen) <= time.time() + 6 + 1, first_seen
    # its upkeep thread has renewed them: it has also moved due retries (the same tick), the
    # way a long-lived worker does, so it would hold any lock for that when it dies
    wait_for(lambda: max(expiries()) > max(first_seen), timeout=10)
    first.kill()  # every run is in flight, in its first model call
    assert all(s is RunStatus.running for s in statuses(broker, runs))

    start()
    # the jobs count as abandoned once their heartbeat runs out (`abandoned_after_s`, 6 s
    # here); the new worker's maintenance (every 3 s) finds them and RQ retries them after the
    # retry's 2 s back-off, once the dead worker's scheduling lock (5 s) ran out: well within
    # the minute RQ's own scheduler lock would have held every retry back
    wait_for(lambda: all_final(broker, runs), timeout=45)
    assert statuses(broker, runs) == [RunStatus.finished] * len(runs)
    assert [effects(broker, r) for r in runs] == [1] * len(runs)


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ({"concurrency": 0}, "workers.concurrency"),
        ({"concurrency": "many"}, "workers.concurrency"),
        ({"run_timeout_s": -1}, "workers.run_timeout_s"),
        ({"loop_block_s": 0}, "workers.loop_block_s"),
        ({"threads": 4}, "workers.threads"),
        ({"abandoned_after_s": 1}, "workers.abandoned_after_s"),
    ],
)
def test_a_bad_workers_section_is_refused_in_one_line(
    section: dict[str, object], where: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"workers": section}, "broker.toml")
    message = str(caught.value)
    assert message.startswith(f"broker.toml: {where}: ") and "\n" not in message


def test_the_workers_section_defaults_to_fifty_runs_at_once() -> None:
    assert parse_config({}).workers.concurrency == 50
