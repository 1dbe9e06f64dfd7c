"""A worker process's slots: threads that each take one RQ job at a time, without forking.

Each slot is an RQ `SimpleWorker` (RQ's documented worker that runs a job in its own process)
driven through RQ's public worker API: `dequeue_job_and_maintain_ttl` takes a job (through the
intermediate queue, so a job dequeued by a process that dies is recovered),
`execute_job` runs it with RQ's own bookkeeping (started registry, results, `Retry`, the
failure callback). The job's agent coroutine runs on the process's shared loop
(`workers.shared_loop`); the slot's thread only waits for it, so N slots cost N mostly idle
threads and one loop.

What a forking worker got from its horse, a slot gets otherwise:

* job timeouts: the shared loop's per-round deadline (`[workers] run_timeout_s`), which cancels
  the run's coroutine; the slot's death penalty (RQ's documented way to kill a job in an
  application's own manner) is that deadline, so no timer thread is started per job;
* heartbeats: one thread keeps every busy slot's execution alive in RQ's started registry with
  a short TTL (`[workers] abandoned_after_s`), so when the whole process is SIGKILLed, its jobs
  are found abandoned within that TTL and retried (RQ's `Retry`) by the maintenance of any
  live worker;
* that thread also beats every slot's worker key (RQ's `heartbeat`, on one pipeline) and a slot
  writes its state only when it changes, so taking a job costs no heartbeat of its own before
  and after each dequeue, nor an `idle` written twice between two jobs;
* maintenance and the scheduler (retries after their back-off) run in that same thread, with
  RQ's public `clean_registries` and `RQScheduler.enqueue_scheduled_jobs`, each under a lock
  of ours with a short TTL: RQ's scheduler lock lives a minute, so a worker SIGKILLed while
  holding it would hold up every retry of the fleet for that long.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import LockError, RedisError
from redis.lock import Lock
from rq import SimpleWorker
from rq.job import Job
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer
from rq.timeouts import BaseDeathPenalty, TimerDeathPenalty

log = logging.getLogger("workers.slots")

HEARTBEAT_TTL_S = 30
"""How long a job of a process that stopped beating stays `started` before it counts as
abandoned (then RQ retries it): `[workers] abandoned_after_s`'s default. A busy slot's
heartbeat is renewed every sixth of it; this process offers to clean RQ's registries (one
process at a time does it) every half of it."""
SCHEDULE_S = 1.0
"""How often the scheduler moves due retries back onto the queue (when it holds the lock)."""
SCHEDULE_LOCK = "rq:approval-broker:schedule:{queue}"
"""Held by the one worker process moving due retries right now, for that move only."""
SCHEDULE_LOCK_S = 5
UPKEEP_LOCK = "rq:approval-broker:upkeep:{queue}"
"""Held (on RQ's Redis) by the one worker process recovering jobs right now; under `rq:`,
where the broker's Redis user may write RQ's keys (the ACL in docs/security.md)."""
UPKEEP_LOCK_S = 30
IDLE_POLL_S = 2
"""How long a slot blocks on an empty queue before it checks whether to stop."""


class LoopDeadline(BaseDeathPenalty):
    """A slot's job timeout: the shared loop's deadline for the job's agent run
    (`workers.shared_loop.SharedLoop.run`, `[workers] run_timeout_s`), which cancels the run
    and fails its round; everything else a job does on its slot is bounded by Redis's socket
    timeouts. RQ's `TimerDeathPenalty` started a thread per job to raise in the slot's thread."""

    def setup_death_penalty(self) -> None:
        return None

    def cancel_death_penalty(self) -> None:
        return None


class SlotWorker(SimpleWorker):
    """RQ's SimpleWorker whose job timeout is the shared loop's deadline, with a short heartbeat
    TTL, and a record of the job it is running (for the heartbeat thread).

    Its worker key is beaten by the slots' keeper thread (`Slots._beat`), so the heartbeats RQ
    sends on their own around each dequeue are left out (those sent within RQ's pipelines, as a
    job starts, stay); and it writes its state only when it changes."""

    death_penalty_class = LoopDeadline
    heartbeat_ttl_s: int = HEARTBEAT_TTL_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.running: Job | None = None

    def get_heartbeat_ttl(self, job: Job) -> int:
        return self.heartbeat_ttl_s

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        if pipeline is None:
            return  # the keeper beats this worker's key with the others'
        super().heartbeat(timeout, pipeline)

    def beat(self, pipeline: Pipeline) -> None:
        """RQ's heartbeat of this worker's key, queued on the keeper's pipeline."""
        super().heartbeat(None, pipeline)

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is None and state == self.get_state():
            return  # `idle` as a job ends, `idle` again as the next dequeue begins: once
        super().set_state(state, pipeline)

    def execute_job(self, job: Job, queue: Queue) -> None:
        self.running = job
        try:
            super().execute_job(job, queue)
        finally:
            self.running = None


class Slots:
    """N slot threads on one queue, plus the thread that beats, cleans and schedules for them."""

    def __init__(
        self,
        queue_name: str,
        connection: Redis,
        concurrency: int,
        log_level: str = "WARNING",
        abandoned_after_s: int = HEARTBEAT_TTL_S,
    ) -> None:
        self.queue_name = queue_name
        self.connection = connection
        self.abandoned_after_s = abandoned_after_s
        self.heartbeat_s = abandoned_after_s / 6
        self.maintenance_s = abandoned_after_s / 2
        base = f"{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self.workers = [
            SlotWorker(
                [queue_name],
                name=f"{base}.{i}",
                connection=connection,
                serializer=JSONSerializer,
                log_job_description=False,
            )
            for i in range(concurrency)
        ]
        for worker in self.workers:
            worker.heartbeat_ttl_s = abandoned_after_s
        # runs no job: RQ's maintenance calls reach a worker object whose execution is unset
        self.upkeep = SlotWorker(
            [queue_name], name=f"{base}.upkeep", connection=connection, serializer=JSONSerializer
        )
        self.upkeep_token = base
        self.scheduler = RQScheduler(
            [queue_name], connection=connection, serializer=JSONSerializer, logging_level=log_level
        )
        self.scheduler.prepare_registries([queue_name])  # moved under our lock, not RQ's
        self.schedule_lock = Lock(
            connection,
            SCHEDULE_LOCK.format(queue=queue_name),
            timeout=SCHEDULE_LOCK_S,
            blocking=False,
            thread_local=False,
        )
        self.stop = threading.Event()
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @property
    def busy(self) -> int:
        """Slots running a job right now."""
        with self._busy_lock:
            return self._busy

    def start(self, *, burst: bool = False) -> None:
        for worker in self.workers:
            worker.register_birth()
        self._maintain()  # before the first job: recover what a dead process left
        for i, worker in enumerate(self.workers):
            t = threading.Thread(target=self._slot, args=(worker, burst), name=f"slot-{i}")
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._keeper, name="slot-keeper", daemon=True).start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every slot to end (after `stop` or, in burst mode, an empty queue)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        self.stop.set()
        for worker in self.workers:
            with contextlib.suppress(RedisError):
                worker.register_death()

    # ---- a slot ------------------------------------------------------------------------------

    def _slot(self, worker: SlotWorker, burst: bool) -> None:
        backoff = 1.0
        while not self.stop.is_set():
            try:
                if burst:
                    result = worker.dequeue_job_and_maintain_ttl(None)
                else:
                    result = worker.dequeue_job_and_maintain_ttl(IDLE_POLL_S, IDLE_POLL_S)
                backoff = 1.0
            except RedisError as exc:
                log.warning("slot %s: Redis failed (%s); trying again in %.0f s", worker.name, exc, backoff)  # fmt: skip
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            if result is None:
                if burst and self.busy == 0:
                    return
                if burst:
                    self.stop.wait(0.05)  # others' jobs may still enqueue more
                continue
            job, queue = result
            with self._busy_lock:
                self._busy += 1
            try:
                worker.execute_job(job, queue)
            except Exception:  # RQ records a job's own failure; this is its bookkeeping failing
                log.exception("slot %s: job %s could not be run or recorded", worker.name, job.id)
            finally:
                with self._busy_lock:
                    self._busy -= 1

    # ---- beats, maintenance, scheduler ---------------------------------------------------------

    def _keeper(self) -> None:
        last_beat = last_clean = time.monotonic()
        while not self.stop.wait(SCHEDULE_S):
            now = time.monotonic()
            try:
                self._schedule()
                if now - last_beat >= self.heartbeat_s:
                    last_beat = now
                    self._beat()
                if now - last_clean >= self.maintenance_s:
                    last_clean = now
                    self._maintain()
            except RedisError as exc:
                log.warning("worker upkeep: Redis failed (%s); trying again", exc)
            except Exception:
                log.exception("worker upkeep failed; trying again")

    def _beat(self) -> None:
        """Every slot's worker key in one pipeline, then each busy slot's job and execution
        (RQ's `maintain_heartbeats`, which beats its worker key again)."""
        with self.connection.pipeline(transaction=False) as pipe:
            for worker in self.workers:
                worker.beat(pipe)
            pipe.execute()
        for worker in self.workers:
            job = worker.running
            if job is None:
                continue
            with contextlib.suppress(AttributeError, RedisError):  # the job may end meanwhile
                worker.maintain_heartbeats(job)

    def _maintain(self) -> None:
        """Recover the jobs of dead processes: abandoned ones (their heartbeat ran out) and ones
        dequeued but never started (left in RQ's intermediate queue).

        Under a lock of its own with a short TTL: RQ's maintenance lock lives 15 minutes, so
        a worker SIGKILLed while holding it would stop every recovery for that long. Abandoned
        jobs are cleaned with a death penalty that works off the main thread (RQ's registry
        would arm SIGALRM around their failure callback); then RQ's own pass, under its lock,
        for the rest. A job whose heartbeat runs out between the two makes RQ's pass raise
        before it touches the job: ours is run again, and RQ's lock released.
        """
        lock = UPKEEP_LOCK.format(queue=self.queue_name)
        if not self.connection.set(lock, self.upkeep_token, nx=True, ex=UPKEEP_LOCK_S):
            return
        try:
            self._recover_abandoned()
            queue = self.upkeep.queues[0]
            queue.intermediate_queue.cleanup(self.upkeep, queue)
            try:
                self.upkeep.clean_registries()
            except ValueError as exc:
                # A job's heartbeat ran out after our pass: RQ's registry armed SIGALRM around
                # its failure callback, which Python refuses off the main thread, before the
                # callback or any write. RQ's lock would hold its pass back for 15 minutes.
                queue.release_maintenance_lock()
                log.warning("RQ's maintenance pass stopped (%s); recovering with ours", exc)
                self._recover_abandoned()
        finally:
            self.connection.delete(lock)

    def _recover_abandoned(self) -> None:
        """Fail or retry the jobs whose heartbeat ran out (RQ's started registry), their
        failure callback bounded by a death penalty that works off the main thread."""
        StartedJobRegistry(
            self.queue_name,
            connection=self.connection,
            serializer=JSONSerializer,
            death_penalty_class=TimerDeathPenalty,
        ).cleanup()

    def _schedule(self) -> None:
        """Move due retries onto the queue, unless another process is doing it right now.

        The lock is held only while moving: a process killed meanwhile holds back the
        fleet's retries for SCHEDULE_LOCK_S at most."""
        if not self.schedule_lock.acquire():
            return
        try:
            self.scheduler.enqueue_scheduled_jobs()
        finally:
            with contextlib.suppress(LockError):  # it outlived its TTL: another may hold it
                self.schedule_lock.release()
