"""The resumer: outbox -> RQ exactly once, through crashes, duplicates and races."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ResponseError
from refunds_demo import Ledger
from rq import Queue

from broker.domain.config import Config
from broker.domain.models import Decision, NewRequest, RunStatus
from broker.facade import Broker
from broker.runs import resume_step
from broker.runs.live_wait import LIVE
from broker.runs.outbox import Resumer
from broker.runs.starting import RESUME_JOB, enqueue_resume, resume_job_id, run_queue
from broker.store.keys import RESUMER_GROUP
from tests.support.backends import (  # noqa: F401 - redis, broker, api_broker on both backends
    on_backend,
    on_backend_api_broker,
    on_backend_broker,
    resume_once,
    settings_for,
)
from tests.support.jobs import work
from tests.support.resumes import answered_run, pending_entries  # noqa: F401
from tests.support.round_claims import claim
from tests.support.waiting import wait_for
from workers import resumer as resumer_module


def _crashing_resumer(
    env: dict[str, str],
    config: Config,
    partition: int,
    where: str,
    reached: multiprocessing.synchronize.Event,
) -> None:
    """Child process: a resumer that stops dead at `where` (the parent SIGKILLs it there)."""
    broker = Broker.from_settings(settings_for(env, key_prefix="t:"), config)

    def stall(*args: object, **kwargs: object) -> bool:
        reached.set()
        threading.Event().wait(60)
        os._exit(3)  # never reached: the parent kills us first

    real_enqueue = resume_step.enqueue_resumes

    def queued_then_stall(queue: object, rounds: object, pipeline: object, *more: object) -> None:
        real_enqueue(queue, rounds, pipeline, *more)  # type: ignore[arg-type]
        stall()

    # before-enqueue: the round is claimed, nothing queued; before-commit: the jobs and acks
    # are queued in the MULTI, never sent
    doomed = stall if where == "before-enqueue" else queued_then_stall
    resume_step.enqueue_resumes = doomed  # type: ignore[assignment]
    Resumer(broker, consumer="doomed", block_ms=None, partition=partition).run_once()


@pytest.mark.parametrize("where", ["before-enqueue", "before-commit"])
def test_resumer_killed_between_reading_and_acking_resumes_exactly_once(
    bound: Broker, backend_env: dict[str, str], config: Config, where: str
) -> None:
    broker = bound
    run_id = answered_run(broker)
    part = broker.keys.partition_of_run(run_id)
    ctx = multiprocessing.get_context("fork")
    reached = ctx.Event()
    args = (backend_env, config, part, where, reached)
    child = ctx.Process(target=_crashing_resumer, args=args)
    child.start()
    try:
        assert reached.wait(20), "the doomed resumer never read the outbox"
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    finally:
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    assert pending_entries(broker, part) == 1  # read but never acknowledged
    assert run_queue(broker).job_ids == []  # enqueueing and acknowledging are one EXEC

    # the restarted resumer (a new consumer name) claims the dead one's entry
    handled = resume_once(broker, consumer="restarted", min_idle_ms=0)
    assert [h.action for h in handled] == ["enqueued"]
    assert run_queue(broker).job_ids == [resume_job_id(run_id, 1)]
    assert pending_entries(broker, part) == 0
    assert resume_once(broker, consumer="again", min_idle_ms=0) == []

    work(broker)
    run = broker.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    assert len(Ledger(broker.redis, broker.keys.prefix).all()) == 1


def test_racing_resumers_enqueue_each_round_once(
    broker: Broker,
    make_broker_on: Callable[..., Broker],
    new_redis: Callable[[], Any],
    config: Config,
) -> None:
    runs = [broker.create_run("refunds", "p").id for _ in range(30)]
    for run_id in runs:  # every round announced twice, as a re-driven entry would be
        for _ in range(2):
            broker.redis.xadd(broker.keys.resumes, {"run_id": run_id, "round": "1"})
    broker.ensure_group(broker.keys.resumes, RESUMER_GROUP)
    results: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def consume(name: str) -> None:
        mine = make_broker_on(config, client=new_redis())
        resumer = Resumer(mine, consumer=name, block_ms=None, count=3)
        start.wait()
        while batch := resumer.run_once():
            with lock:
                results.extend(h.action for h in batch)

    threads = [threading.Thread(target=consume, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert sorted(run_queue(broker).job_ids) == sorted(resume_job_id(r, 1) for r in runs)
    assert results.count("enqueued") == 30
    assert pending_entries(broker) == 0


def test_malformed_or_orphan_entries_go_to_dead_letters(broker: Broker) -> None:
    broker.redis.xadd(broker.keys.resumes, {"run_id": "run_x", "round": "one"})
    broker.redis.xadd(broker.keys.resumes, {"run_id": "run_gone", "round": "2"})
    handled = Resumer(broker, consumer="r", block_ms=None).run_once()
    assert [h.action for h in handled] == ["dead-lettered", "dead-lettered"]
    letters = broker.dead_letters()
    assert [f["source"] for _, f in letters] == ["resumer", "resumer"]
    assert "malformed outbox entry" in letters[0][1]["error"]
    assert letters[1][1]["error"] == "run run_gone does not exist"
    assert letters[1][1]["stream"] == broker.keys.resumes  # so it can be re-driven
    assert run_queue(broker).count == 0
    assert pending_entries(broker) == 0


def test_a_decision_writes_the_outbox_entry_the_resumer_enqueues(broker: Broker) -> None:
    run = broker.create_run("refunds", "p")
    [request] = broker.create_round(run.id, 1, [NewRequest(tool_name="t")])
    part = broker.keys.partition_of_run(run.id)
    resumer = Resumer(broker, consumer="r", block_ms=None, partition=part)
    assert resumer.run_once() == []
    broker.decide(request.id, Decision(outcome="rejected", reason="no"), decided_by="x")
    [handled] = resumer.run_once()
    assert (handled.run_id, handled.round, handled.action) == (run.id, 1, "enqueued")
    job = run_queue(broker).fetch_job(resume_job_id(run.id, 1))
    assert job is not None and job.func_name == RESUME_JOB == "broker.runs.agent_jobs.resume_agent"
    assert job.args == [run.id, 1]


def test_run_resumer_role_stops_on_request(
    broker: Broker,
    backend_env: dict[str, str],
    config: Config,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = broker.create_run("refunds", "p")
    [request] = broker.create_round(run.id, 1, [NewRequest(tool_name="t")])
    broker.decide(request.id, Decision(outcome="approved"), decided_by="x")
    stop = threading.Event()
    settings = settings_for(backend_env, key_prefix="t:")
    thread = threading.Thread(
        target=resumer_module.run_resumer, args=(settings, config), kwargs={"stop": stop}
    )
    thread.start()
    try:
        wait_for(lambda: run_queue(broker).count == 1)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert "resumer ready" in capsys.readouterr().out


def _outbox(broker: Broker, *run_ids: str) -> list[str]:
    ids = [broker.redis.xadd(broker.keys.resumes, {"run_id": r, "round": "1"}).decode() for r in run_ids]  # fmt: skip
    return ids


def test_a_poison_entry_does_not_stall_the_others_and_is_dead_lettered_after_five_tries(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison, good, other = (broker.create_run("refunds", "p").id for _ in range(3))
    _outbox(broker, poison, good, other)
    real_enqueue = resume_step.enqueue_resumes

    def enqueue(
        queue: Queue, rounds: list[tuple[str, int]], pipeline: object, *more: object
    ) -> None:
        if any(run_id == poison for run_id, _ in rounds):  # the batch fails, then it alone
            raise RuntimeError("job payload too large")
        real_enqueue(queue, rounds, pipeline, *more)  # type: ignore[arg-type]

    monkeypatch.setattr(resume_step, "enqueue_resumes", enqueue)
    resumer = Resumer(broker, consumer="r", min_idle_ms=0, block_ms=None)
    assert [h.action for h in resumer.run_once()] == ["failed", "enqueued", "enqueued"]
    assert sorted(run_queue(broker).job_ids) == sorted([resume_job_id(good, 1), resume_job_id(other, 1)])  # fmt: skip

    rounds = [[h.action for h in resumer.run_once()] for _ in range(4)]  # reclaimed each time
    assert rounds == [["failed"], ["failed"], ["failed"], ["dead-lettered"]]
    [(_, letter)] = broker.dead_letters()
    assert letter["error"] == (
        "outbox entry delivered 5 times without success; "
        "last error: RuntimeError: job payload too large"
    )
    assert letter["f.run_id"] == poison  # can be re-driven once fixed
    assert pending_entries(broker) == 0
    assert resumer.run_once() == []


def test_an_entry_that_keeps_killing_resumers_is_dead_lettered_unhandled(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = broker.create_run("refunds", "p").id
    broker.ensure_group(broker.keys.resumes, RESUMER_GROUP)
    [entry] = _outbox(broker, run_id)
    for i in range(6):  # six resumers took it and died before acknowledging it
        broker.redis.xautoclaim(broker.keys.resumes, RESUMER_GROUP, f"dead{i}", 0, "0-0")
        if i == 0:
            broker.redis.xreadgroup(RESUMER_GROUP, "dead0", {broker.keys.resumes: ">"})

    def must_not_run(*args: object) -> bool:
        raise AssertionError("the entry was handled again")

    monkeypatch.setattr(resume_step, "enqueue_resumes", must_not_run)
    [handled] = Resumer(broker, consumer="r", min_idle_ms=0, block_ms=None).run_once()
    assert (handled.entry_id, handled.action) == (entry, "dead-lettered")
    [(_, letter)] = broker.dead_letters()
    assert letter["error"].endswith("without success; it was never acknowledged")
    assert pending_entries(broker) == 0


def test_the_group_is_created_once_and_again_only_if_it_disappears(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_ensure = broker.ensure_group

    def ensure(stream: str, group: str) -> None:
        calls.append(group)
        real_ensure(stream, group)

    monkeypatch.setattr(broker, "ensure_group", ensure)
    resumer = Resumer(broker, consumer="r", block_ms=None)
    for _ in range(3):
        assert resumer.run_once() == []
    assert calls == [RESUMER_GROUP]

    broker.redis.delete(broker.keys.resumes)  # e.g. a flushed Redis: the group is gone
    with pytest.raises(ResponseError, match="NOGROUP"):
        resumer.run_once()
    run_id = broker.create_run("refunds", "p").id
    _outbox(broker, run_id)  # written again after the flush, before the group is back
    assert [h.action for h in resumer.run_once()] == ["enqueued"]
    assert calls == [RESUMER_GROUP, RESUMER_GROUP]


def test_entries_deleted_while_pending_are_acknowledged_and_skipped(broker: Broker) -> None:
    gone, kept = (broker.create_run("refunds", "p").id for _ in range(2))
    broker.ensure_group(broker.keys.resumes, RESUMER_GROUP)
    gone_entry, _ = _outbox(broker, gone, kept)
    broker.redis.xreadgroup(RESUMER_GROUP, "dead", {broker.keys.resumes: ">"})  # then it died
    broker.redis.xdel(broker.keys.resumes, gone_entry)  # Redis 6.2 claims it back without an id

    handled = Resumer(broker, consumer="r", min_idle_ms=0, block_ms=None).run_once()
    assert [(h.run_id, h.action) for h in handled] == [(kept, "enqueued")]
    assert pending_entries(broker) == 0
    assert run_queue(broker).job_ids == [resume_job_id(kept, 1)]


def test_an_entry_whose_job_already_exists_is_acknowledged_without_a_second_job(
    broker: Broker,
) -> None:
    runs = [broker.create_run("refunds", "p").id for _ in range(3)]
    assert enqueue_resume(broker, runs[1], 1)  # enqueued before (an older resumer, a redrive)
    _outbox(broker, *runs)
    _outbox(broker, runs[2])  # the same round announced twice in one batch
    handled = Resumer(broker, consumer="r", block_ms=None).run_once()
    assert [h.action for h in handled] == ["enqueued", "duplicate", "enqueued", "duplicate"]
    assert sorted(run_queue(broker).job_ids) == sorted(resume_job_id(r, 1) for r in runs)
    assert pending_entries(broker) == 0
    assert broker.redis.xlen(broker.keys.resumes) == 0


def test_a_round_a_live_job_claimed_is_acknowledged_without_a_job(broker: Broker) -> None:
    run_id = broker.create_run("refunds", "p").id
    assert claim(broker, run_id, 1, LIVE)
    _outbox(broker, run_id)
    [handled] = Resumer(broker, consumer="r", block_ms=None).run_once()
    assert handled.action == "live"
    assert run_queue(broker).job_ids == []
    assert pending_entries(broker) == 0
