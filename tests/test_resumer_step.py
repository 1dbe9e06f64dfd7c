"""The resumer's Lua step: RQ's own job bytes, one round trip a batch, one resume per round."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from broker import outbox
from broker.client import Broker
from broker.config import Config
from broker.keys import RESUMER_GROUP
from broker.live_wait import LIVE, RESUMER, claim, claim_field, claimed_by, live_field
from broker.models import RunStatus
from broker.outbox import Resumer
from broker.resume_step import JobTemplate, UnexpectedRQ
from broker.runs import resume_job_id, run_queue
from tests.backends import (  # noqa: F401 - redis, broker, api_broker on both backends
    on_backend,
    on_backend_api_broker,
    on_backend_broker,
    single_only,
)
from tests.conftest import work
from tests.test_resumer import answered_run, pending_entries


def _outbox(broker: Broker, run_ids: list[str], round_no: int = 1) -> None:
    for run_id in run_ids:
        stream = broker.keys.of_run(run_id).resumes
        broker.redis.xadd(stream, {"run_id": run_id, "round": str(round_no)})


def _job_hash(broker: Broker, job_id: str) -> dict[bytes, bytes]:
    return broker.store.rq_redis.hgetall(Job.key_for(job_id))


@single_only  # cluster: RQ has its own Redis there, so the resumer keeps its WATCH path
def test_the_step_writes_the_job_rq_enqueue_many_writes(broker: Broker) -> None:
    run_id = broker.create_run("refunds", "p").id
    _outbox(broker, [run_id], 3)
    resumer = Resumer(broker, consumer="r", block_ms=None)
    assert resumer.step() is not None
    [handled] = resumer.run_once()
    assert handled.action == "enqueued"
    job_id = resume_job_id(run_id, 3)
    by_step = _job_hash(broker, job_id)
    assert broker.redis.lrange(run_queue(broker).key, 0, -1) == [job_id.encode()]
    assert broker.redis.smembers(Queue.redis_queues_keys) == {run_queue(broker).key.encode()}

    broker.redis.delete(Job.key_for(job_id), run_queue(broker).key, Queue.redis_queues_keys)
    with broker.redis.pipeline() as pipe:  # RQ's own path, for the same round
        outbox.enqueue_with_rq(run_queue(broker), [(run_id, 3)], pipe)
        pipe.execute()
    by_rq = _job_hash(broker, job_id)
    stamps = {k.encode() for k in ("created_at", "enqueued_at")}
    assert {k: v for k, v in by_step.items() if k not in stamps} == {
        k: v for k, v in by_rq.items() if k not in stamps
    }
    assert set(by_step) == set(by_rq)
    assert broker.redis.lrange(run_queue(broker).key, 0, -1) == [job_id.encode()]

    job = Job.fetch(job_id, connection=broker.redis, serializer=JSONSerializer)
    assert (job.func_name, job.args, job.get_status()) == (
        "broker.jobs.resume_agent",
        [run_id, 3],
        "queued",
    )
    assert job.retries_left == 3 and job.failure_callback is not None


@single_only  # cluster: the step runs on a single Redis only
def test_a_job_the_step_wrote_is_run_by_a_real_rq_worker(bound: Broker) -> None:
    run_id = answered_run(bound)
    [handled] = Resumer(bound, consumer="r", block_ms=None).run_once()
    assert handled.action == "enqueued"
    work(bound)  # RQ's SimpleWorker
    run = bound.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    job = Job.fetch(resume_job_id(run_id, 1), connection=bound.redis, serializer=JSONSerializer)
    assert job.get_status() == "finished"


@single_only  # cluster: the step runs on a single Redis only
def test_a_batch_is_one_evalsha_and_no_watch(broker: Broker) -> None:
    runs = [broker.create_run("refunds", "p").id for _ in range(50)]
    _outbox(broker, runs)
    resumer = Resumer(broker, consumer="r", block_ms=None)
    resumer.step()
    broker.redis.config_resetstat()
    handled = resumer.run_once()
    assert [h.action for h in handled] == ["enqueued"] * 50
    stats = broker.redis.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1
    assert not {"cmdstat_watch", "cmdstat_multi", "cmdstat_exec"} & set(stats)
    assert sorted(run_queue(broker).job_ids) == sorted(resume_job_id(r, 1) for r in runs)
    assert pending_entries(broker) == 0 and broker.redis.xlen(broker.keys.resumes) == 0


@single_only  # cluster: the step runs on a single Redis only
def test_a_gone_run_is_left_to_the_dead_letters_and_the_rest_enqueued(broker: Broker) -> None:
    kept = broker.create_run("refunds", "p").id
    _outbox(broker, ["run_gone", kept])
    handled = Resumer(broker, consumer="r", block_ms=None).run_once()
    assert [(h.run_id, h.action) for h in handled] == [
        ("run_gone", "dead-lettered"),
        (kept, "enqueued"),
    ]
    assert run_queue(broker).job_ids == [resume_job_id(kept, 1)]
    assert broker.redis.hget(broker.keys.run("run_gone"), claim_field(1)) is None
    assert pending_entries(broker) == 0


def test_an_unexpected_rq_is_refused_and_the_resumer_keeps_rqs_path(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def other_rq(queue: Queue, rounds: list[Any], pipeline: Any) -> None:
        outbox.enqueue_with_rq(queue, rounds, pipeline)
        pipeline.expire("rq:job:x", 10)  # a command the template does not know

    with pytest.raises(UnexpectedRQ):
        JobTemplate.from_rq(run_queue(broker), other_rq)

    def refuse(*args: object) -> JobTemplate:
        raise UnexpectedRQ("changed")

    monkeypatch.setattr(JobTemplate, "from_rq", refuse)
    run_id = broker.create_run("refunds", "p").id
    _outbox(broker, [run_id])
    resumer = Resumer(broker, consumer="r", block_ms=None)
    assert resumer.step() is None
    handled = [h for each in resumer.per_partition() for h in each.run_once()]
    assert [h.action for h in handled] == ["enqueued"]
    assert run_queue(broker).job_ids == [resume_job_id(run_id, 1)]


def test_the_template_varies_only_timestamps_data_and_description(broker: Broker) -> None:
    template = JobTemplate.from_rq(run_queue(broker), outbox.enqueue_with_rq)
    names = {name for name, _ in template.constant}
    assert {"status", "origin", "timeout", "retries_left", "failure_callback_name"} <= names


def test_a_field_rq_writes_per_job_that_the_step_would_copy_is_refused(broker: Broker) -> None:
    def job_dependent(queue: Queue, rounds: list[Any], pipeline: Any) -> None:
        outbox.enqueue_with_rq(queue, rounds, _Stamped(pipeline, rounds))

    with pytest.raises(UnexpectedRQ, match="depend on the job"):
        JobTemplate.from_rq(run_queue(broker), job_dependent)


class _Stamped:
    """A pipeline that adds a field naming the job to every job hash (a job-dependent option)."""

    def __init__(self, pipeline: Any, rounds: list[Any]) -> None:
        self._pipeline, self._rounds = pipeline, rounds

    def hset(self, name: Any, *args: Any, mapping: Any = None, **kwargs: Any) -> Any:
        if mapping is not None:
            mapping = {**mapping, "meta": f"for {self._rounds[0][0]}"}
        return self._pipeline.hset(name, *args, mapping=mapping, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline, name)


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


@single_only  # cluster: the WATCH path claims at once, and the live job's wait is slower anyway
def test_a_round_a_live_job_still_waits_for_is_left_to_it(broker: Broker) -> None:
    """The step is one round trip, the live job's claim two after the same wake-up: without the
    job's deadline on the run the resumer would win every race and the live wait never pay."""
    run_id = broker.create_run("refunds", "p").id
    broker.redis.hset(broker.keys.run(run_id), live_field(1), f"{time.time() + 30:.6f}")
    _outbox(broker, [run_id])
    resumer = Resumer(broker, consumer="r", block_ms=50)
    [handled] = resumer.run_once()
    assert handled.action == "deferred"
    assert claimed_by(broker, run_id, 1) is None and pending_entries(broker) == 1
    assert claim(broker, run_id, 1, LIVE)  # the live job goes on with the round
    looked = []
    deadline = time.monotonic() + 10
    while not looked and time.monotonic() < deadline:  # no new entry: the deferred one is due
        looked = resumer.run_once()
    assert [h.action for h in looked] == ["live"]
    assert run_queue(broker).job_ids == [] and pending_entries(broker) == 0


@single_only
def test_a_round_whose_live_wait_ended_unclaimed_is_resumed(broker: Broker) -> None:
    run_id = broker.create_run("refunds", "p").id
    broker.redis.hset(broker.keys.run(run_id), live_field(1), f"{time.time() + 0.3:.6f}")
    _outbox(broker, [run_id])
    resumer = Resumer(broker, consumer="r", block_ms=50)
    assert [h.action for h in resumer.run_once()] == ["deferred"]
    done: list[Any] = []
    deadline = time.monotonic() + 10
    while not done and time.monotonic() < deadline:  # the live job died: its deadline passes
        done = [h for h in resumer.run_once() if h.action != "deferred"]
    assert [h.action for h in done] == ["enqueued"]
    assert claimed_by(broker, run_id, 1) == RESUMER
    assert run_queue(broker).job_ids == [resume_job_id(run_id, 1)]
