"""The resumer's batch: RQ's own enqueue, a fixed number of round trips, one resume per round."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from broker.domain.config import Config
from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.runs import resume_step
from broker.runs.live_wait import LIVE, RESUMER, claim_field, claimed_by, live_field
from broker.runs.outbox import Resumer
from broker.runs.resume_step import ClaimStep
from broker.runs.starting import resume_job_id, run_queue
from broker.store.keys import RESUMER_GROUP
from tests.support.backends import (  # noqa: F401 - redis, broker, api_broker on both backends
    on_backend,
    on_backend_api_broker,
    on_backend_broker,
    settings_for,
    single_only,
)
from tests.support.counted_redis import redis_server  # noqa: F401 - counts need a Redis of their own
from tests.support.jobs import work
from tests.support.resumes import answered_run, pending_entries
from tests.support.round_claims import claim


def _outbox(broker: Broker, run_ids: list[str], round_no: int = 1) -> None:
    for run_id in run_ids:
        stream = broker.keys.of_run(run_id).resumes
        broker.redis.xadd(stream, {"run_id": run_id, "round": str(round_no)})


def _resume_all(broker: Broker, **options: Any) -> list[str]:
    return [h.action for r in Resumer(broker, block_ms=None, **options).per_partition() for h in r.run_once()]  # fmt: skip


def test_the_resume_job_is_rqs_own_under_the_deterministic_id(broker: Broker) -> None:
    run_id = broker.create_run("refunds", "p").id
    _outbox(broker, [run_id], 3)
    assert _resume_all(broker, consumer="r") == ["enqueued"]
    job_id = resume_job_id(run_id, 3)
    queue = run_queue(broker)
    assert queue.job_ids == [job_id] == [f"resume-{run_id}-3"]
    rq = broker.store.rq_redis
    assert rq.smembers(Queue.redis_queues_keys) == {queue.key.encode()}
    job = Job.fetch(job_id, connection=rq, serializer=JSONSerializer)
    assert (job.func_name, job.args, job.get_status(), job.origin) == (
        "broker.runs.agent_jobs.resume_agent",
        [run_id, 3],
        "queued",
        "agent-runs",
    )
    assert job.retries_left == 3 and job.failure_callback is not None
    assert job.timeout == 900 and job.result_ttl == job.failure_ttl == 7 * 86400


@single_only  # cluster: the demo agent's in-process jobs are bound to a single Redis here
def test_a_job_the_resumer_enqueued_is_run_by_a_real_rq_worker(bound: Broker) -> None:
    run_id = answered_run(bound)
    [handled] = Resumer(bound, consumer="r", block_ms=None).run_once()
    assert handled.action == "enqueued"
    work(bound)  # RQ's SimpleWorker
    run = bound.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    job = Job.fetch(resume_job_id(run_id, 1), connection=bound.redis, serializer=JSONSerializer)
    assert job.get_status() == "finished"


@single_only  # cluster: its commands are spread over the nodes and RQ's Redis
def test_a_batch_is_one_watch_one_claim_step_and_one_exec_whatever_its_size(
    broker: Broker,
) -> None:
    runs = [broker.create_run("refunds", "p").id for _ in range(50)]
    _outbox(broker, runs)
    resumer = Resumer(broker, consumer="r", block_ms=None)
    resumer.queue.get_redis_server_version()  # RQ asks once per Queue object
    broker.redis.config_resetstat()
    handled = resumer.run_once()
    assert [h.action for h in handled] == ["enqueued"] * 50
    stats = broker.redis.info("commandstats")
    for command in ("watch", "multi", "exec"):
        assert stats[f"cmdstat_{command}"]["calls"] == 1
    assert stats["cmdstat_evalsha"]["calls"] + stats.get("cmdstat_eval", {"calls": 0})["calls"] == 1  # fmt: skip
    assert sorted(run_queue(broker).job_ids) == sorted(resume_job_id(r, 1) for r in runs)
    assert pending_entries(broker) == 0 and broker.redis.xlen(broker.keys.resumes) == 0


@single_only  # cluster: RQ's keys are on another Redis there, out of the step's reach anyway
def test_the_claim_step_writes_no_rq_key(broker: Broker) -> None:
    runs = [broker.create_run("refunds", "p").id for _ in range(3)]
    job_keys = [Job.key_for(resume_job_id(r, 1)) for r in runs]
    words = ClaimStep(broker.redis).run([broker.keys.run(r) for r in runs], [1, 1, 1], job_keys)
    assert words == ["enqueue"] * 3
    assert [claimed_by(broker, r, 1) for r in runs] == [RESUMER] * 3
    assert broker.redis.keys("rq:*") == []


def test_a_gone_run_is_left_to_the_dead_letters_and_the_rest_enqueued(broker: Broker) -> None:
    kept = broker.create_run("refunds", "p").id
    gone = "run_gone"
    stream = broker.keys.of_run(kept).resumes  # the gone run's entry on the same outbox
    for run_id in (gone, kept):
        broker.redis.xadd(stream, {"run_id": run_id, "round": "1"})
    part = broker.keys.partition_of_run(kept)
    handled = Resumer(broker, consumer="r", block_ms=None, partition=part).run_once()
    assert [(h.run_id, h.action) for h in handled] == [(gone, "dead-lettered"), (kept, "enqueued")]
    assert run_queue(broker).job_ids == [resume_job_id(kept, 1)]
    assert broker.redis.hget(broker.keys.run(gone), claim_field(1)) is None
    assert pending_entries(broker, part) == 0


def test_a_job_made_by_another_resumer_after_the_claim_is_not_enqueued_again(
    broker: Broker,
    make_broker_on: Callable[..., Broker],
    new_redis: Callable[[], Any],
    config: Config,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same round announced twice, taken by two resumers at once: the first has claimed it
    and is about to enqueue when the second enqueues it; the first's EXEC must not go through."""
    run_id = broker.create_run("refunds", "p").id
    _outbox(broker, [run_id, run_id])
    part = broker.keys.partition_of_run(run_id)
    broker.ensure_group(broker.keys.part(part).resumes, RESUMER_GROUP)
    real_enqueue = resume_step.enqueue_resumes
    paused, go_on = threading.Event(), threading.Event()
    slow = threading.local()

    def enqueue(queue: Queue, rounds: list[Any], pipeline: Any, *more: Any) -> None:
        if getattr(slow, "on", False) and not paused.is_set():
            paused.set()  # claimed, jobs' keys WATCHed, nothing enqueued yet
            assert go_on.wait(20)
        real_enqueue(queue, rounds, pipeline, *more)

    monkeypatch.setattr(resume_step, "enqueue_resumes", enqueue)
    first: list[str] = []

    def slow_resumer() -> None:
        slow.on = True
        mine = make_broker_on(config, client=new_redis())
        resumer = Resumer(mine, consumer="slow", block_ms=None, count=1, partition=part)
        first.extend(h.action for h in resumer.run_once())

    thread = threading.Thread(target=slow_resumer)
    thread.start()
    try:
        assert paused.wait(20)
        assert claimed_by(broker, run_id, 1) == RESUMER
        other = Resumer(broker, consumer="fast", block_ms=None, count=1, partition=part)
        assert [h.action for h in other.run_once()] == ["enqueued"]
    finally:
        go_on.set()
        thread.join(20)
    assert first == ["duplicate"]
    assert run_queue(broker).job_ids == [resume_job_id(run_id, 1)]
    assert pending_entries(broker, part) == 0


def _resumer_process(env: dict[str, str], config: Config, name: str, start: Any) -> None:
    """Child process: one resumer draining every partition's outbox, then exiting."""
    broker = Broker.from_settings(settings_for(env, key_prefix="t:"), config)
    each = Resumer(broker, consumer=name, block_ms=None, count=5).per_partition()
    start.wait(30)
    while [h for r in each for h in r.run_once()]:
        pass


def test_two_resumer_processes_on_duplicated_entries_resume_each_round_once(
    broker: Broker, backend_env: dict[str, str], config: Config
) -> None:
    runs = [broker.create_run("refunds", "p").id for _ in range(40)]
    for _ in range(2):  # every round announced twice, as a re-driven entry would be
        _outbox(broker, runs)
    for part in range(broker.keys.partitions):
        broker.ensure_group(broker.keys.part(part).resumes, RESUMER_GROUP)
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_resumer_process, args=(backend_env, config, f"p{i}", start)) for i in range(2)]  # fmt: skip
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0]
    assert sorted(run_queue(broker).job_ids) == sorted(resume_job_id(r, 1) for r in runs)
    assert all(claimed_by(broker, r, 1) == RESUMER for r in runs)
    assert all(pending_entries(broker, p) == 0 for p in range(broker.keys.partitions))


def test_resumers_racing_live_waits_resume_each_round_exactly_once(
    broker: Broker,
    make_broker_on: Callable[..., Broker],
    new_redis: Callable[[], Any],
    config: Config,
) -> None:
    """Four resumers (threads, each its own connection) and a live job claiming every round."""
    runs = [broker.create_run("refunds", "p").id for _ in range(60)]
    for _ in range(2):  # every round announced twice, as a re-driven entry would be
        _outbox(broker, runs)
    for part in range(broker.keys.partitions):
        broker.ensure_group(broker.keys.part(part).resumes, RESUMER_GROUP)
    results: list[str] = []
    live_won: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(5)

    def consume(name: str) -> None:
        mine = make_broker_on(config, client=new_redis())
        each = Resumer(mine, consumer=name, block_ms=None, count=4).per_partition()
        start.wait()
        while batch := [h for r in each for h in r.run_once()]:
            with lock:
                results.extend(h.action for h in batch)

    def live_waits() -> None:
        mine = make_broker_on(config, client=new_redis())
        start.wait()
        for run_id in reversed(runs):  # from the end, so both sides win some rounds
            if claim(mine, run_id, 1, LIVE):
                live_won.append(run_id)

    threads = [threading.Thread(target=consume, args=(f"r{i}",)) for i in range(4)]
    threads.append(threading.Thread(target=live_waits))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)

    owners = {run_id: claimed_by(broker, run_id, 1) for run_id in runs}
    resumed = sorted(r for r, who in owners.items() if who == RESUMER)
    assert sorted(r for r, who in owners.items() if who == LIVE) == sorted(live_won)
    assert len(resumed) + len(live_won) == len(runs)
    assert sorted(run_queue(broker).job_ids) == sorted(resume_job_id(r, 1) for r in resumed)
    assert results.count("enqueued") == len(resumed)
    assert len(results) == 2 * len(runs)
    assert all(pending_entries(broker, p) == 0 for p in range(broker.keys.partitions))


def test_a_round_a_live_job_still_waits_for_is_left_to_it(broker: Broker) -> None:
    """The resumer is woken by the same outcome as the live job: without the job's deadline on
    the run the resumer would often win the race and the live wait not pay."""
    run_id = broker.create_run("refunds", "p").id
    broker.redis.hset(broker.keys.run(run_id), live_field(1), f"{time.time() + 30:.6f}")
    _outbox(broker, [run_id])
    part = broker.keys.partition_of_run(run_id)
    resumer = Resumer(broker, consumer="r", block_ms=50, partition=part)
    [handled] = resumer.run_once()
    assert handled.action == "deferred"
    assert claimed_by(broker, run_id, 1) is None and pending_entries(broker, part) == 1
    assert claim(broker, run_id, 1, LIVE)  # the live job goes on with the round
    looked = []
    deadline = time.monotonic() + 10
    while not looked and time.monotonic() < deadline:  # no new entry: the deferred one is due
        looked = resumer.run_once()
    assert [h.action for h in looked] == ["live"]
    assert run_queue(broker).job_ids == [] and pending_entries(broker, part) == 0


def test_a_round_whose_live_wait_ended_unclaimed_is_resumed(broker: Broker) -> None:
    run_id = broker.create_run("refunds", "p").id
    broker.redis.hset(broker.keys.run(run_id), live_field(1), f"{time.time() + 0.3:.6f}")
    _outbox(broker, [run_id])
    part = broker.keys.partition_of_run(run_id)
    resumer = Resumer(broker, consumer="r", block_ms=50, partition=part)
    assert [h.action for h in resumer.run_once()] == ["deferred"]
    done: list[Any] = []
    deadline = time.monotonic() + 10
    while not done and time.monotonic() < deadline:  # the live job died: its deadline passes
        done = [h for h in resumer.run_once() if h.action != "deferred"]
    assert [h.action for h in done] == ["enqueued"]
    assert claimed_by(broker, run_id, 1) == RESUMER
    assert run_queue(broker).job_ids == [resume_job_id(run_id, 1)]
