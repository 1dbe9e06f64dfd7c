"""One `approval-broker worker` process runs many agent runs at once, and a bad one stays alone.

A real worker process on a real Redis (agents from `tests.support.slot_agents`, loaded by import
path): many runs advance together on its one event loop (each waits in its model call until all
of them are in theirs), while a run that raises, one that hangs past `[workers] run_timeout_s`
and one that blocks the loop with `time.sleep` each fail with their cause in the run (what
`GET /v1/runs/{id}` shows), and the others finish. A worker SIGKILLed with many runs in flight,
held before, inside and after their tool, leaves none behind: RQ finds the jobs abandoned, a new
worker retries them, and no tool runs twice (a run killed inside its tool fails with that cause).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis
from rq.job import Job
from rq.registry import StartedJobRegistry

from broker.domain.config import load_config, parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import Decision, RunStatus
from broker.facade import Broker
from broker.runs.live_wait import LIVE, claimed_by
from broker.runs.starting import RUN_QUEUE, resume_job_id, start_run
from tests.support.slot_agents import TOGETHER, Where, effects_key, held_key
from tests.support.waiting import wait_for
from tests.support.worker_process import WorkerProcess  # noqa: F401

PREFIX = "t:"
CONFIG = """
[queues.default]
channels = ["inbox"]

[workers]
concurrency = 60
run_timeout_s = {run_timeout_s}
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

[agents.held]
path = "tests.support.slot_agents:held_agent"
deps = "tests.support.slot_agents:held_run"

[agents.refund]
path = "tests.support.slot_agents:refund_agent"
deps = "tests.support.agents:make_recorder"
"""

FINAL = (RunStatus.finished, RunStatus.failed)


@pytest.fixture
def run_timeout_s() -> int:
    """`[workers] run_timeout_s`: a test parametrizes it to give its runs longer."""
    return 10


@pytest.fixture
def fleet(redis: Redis, redis_url: str, tmp_path: Path, run_timeout_s: int) -> Iterator[tuple[Broker, Callable[[], WorkerProcess]]]:  # fmt: skip
    config_path = tmp_path / "slots.toml"
    config_path.write_text(CONFIG.format(run_timeout_s=run_timeout_s))
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
    # each waits in its first model call until all TOGETHER are in theirs: a worker that ran
    # them one after the other would leave the first waiting until its run_timeout_s failed it
    slow = [start_run(broker, "slow", f"task {i}").id for i in range(TOGETHER)]
    raising = start_run(broker, "raising", "go").id
    hanging = start_run(broker, "hanging", "go").id
    blocking = start_run(broker, "blocking", "go").id
    wait_for(lambda: all_final(broker, slow), timeout=60)
    wait_for(lambda: all_final(broker, [raising, hanging, blocking]), timeout=60)

    slow_runs = [broker.get_run(r) for r in slow]
    assert [(r.status, r.error) for r in slow_runs] == [(RunStatus.finished, None)] * len(slow)
    assert [effects(broker, r) for r in slow] == [1] * len(slow)

    failed = {name: broker.get_run(r) for name, r in [("raising", raising), ("hanging", hanging), ("blocking", blocking)]}  # fmt: skip
    assert {n: r.status for n, r in failed.items()} == dict.fromkeys(failed, RunStatus.failed)
    assert "ValueError: the model's answer made no sense" in (failed["raising"].error or "")
    assert "run_timeout_s = 10 s" in (failed["hanging"].error or "")
    assert "blocked the worker's event loop" in (failed["blocking"].error or "")


def test_a_worker_goes_on_with_a_round_answered_within_its_default_live_wait(
    fleet: tuple[Broker, Callable[[], WorkerProcess]],
) -> None:
    """The agent sets no `live_wait_s`: the worker's `[workers] live_wait_s` (2 s by default)
    holds the paused job, which claims the answered round and goes on: no resume job."""
    broker, start = fleet
    start()
    run = start_run(broker, "refund", "Refund A1.")
    [rid] = wait_for(lambda: broker.get_run(run.id).pending, timeout=30)
    broker.decide(rid, Decision(outcome="approved"), decided_by="ann")
    wait_for(lambda: broker.get_run(run.id).status in FINAL, timeout=30)
    assert broker.get_run(run.id).status is RunStatus.finished
    assert claimed_by(broker, run.id, 1) == LIVE
    assert not Job.exists(resume_job_id(run.id, 1), connection=broker.redis)


HOLDS: tuple[Where, ...] = ("before", "tool", "after")


@pytest.mark.parametrize("run_timeout_s", [60])  # the held runs wait for the kill, not for it
def test_a_worker_killed_with_runs_held_before_inside_and_after_their_tool_leaves_none_behind_and_runs_no_tool_twice(
    fleet: tuple[Broker, Callable[[], WorkerProcess]],
) -> None:
    broker, start = fleet
    first = start()
    holds: dict[str, Where] = {}
    for i in range(30):
        hold = HOLDS[i % len(HOLDS)]
        holds[start_run(broker, "held", f"task {i}", deps={"hold": hold}).id] = hold
    runs = list(holds)
    # every run says when it is held: in its first model call, inside its tool (after the
    # tool's effect, while the runner counts it as running), or in the model call after it
    wait_for(lambda: broker.redis.llen(held_key(PREFIX)) == len(runs), timeout=60)
    assert sorted(r.decode() for r in broker.redis.lrange(held_key(PREFIX), 0, -1)) == sorted(runs)
    assert [effects(broker, r) for r in runs] == [int(h != "before") for h in holds.values()]
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
    first.kill()  # every run is still held where it said
    assert all(s is RunStatus.running for s in statuses(broker, runs))

    start()
    # the jobs count as abandoned once their heartbeat runs out (`abandoned_after_s`, 6 s
    # here); the new worker's maintenance (every 3 s) finds them and RQ retries them after the
    # retry's 2 s back-off, once the dead worker's scheduling lock (5 s) ran out: well within
    # the minute RQ's own scheduler lock would have held every retry back
    wait_for(lambda: all_final(broker, runs), timeout=45)
    # each tool ran once: the runs held before it ran it on the retry, the runs held after it
    # went on from the checkpoint, and a run killed inside it is stopped rather than run twice
    assert [effects(broker, r) for r in runs] == [1] * len(runs)
    ended = {r: broker.get_run(r) for r in runs}
    for run_id, hold in holds.items():
        run = ended[run_id]
        if hold == "tool":
            assert run.status is RunStatus.failed, (hold, run.status, run.error)
            assert "interrupted in round 0 while its tools were running on worker " in (run.error or "")  # fmt: skip
        else:
            assert (run.status, run.error) == (RunStatus.finished, None), (hold, run.error)


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
