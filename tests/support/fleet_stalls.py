"""Why the fleet's drain made no progress for a while: each open run's RQ job, and a named cause.

The harness heals nothing (no worker restarts): when no run finishes for a while, every open
run must wait for a reason the fleet's recovery bounds, read from RQ's registries without
running any of RQ's cleanups (reading must not recover anything itself):

- TAKEN_NOT_STARTED: a worker dequeued the job (RQ's intermediate queue) and was SIGKILLed
  before it started it; RQ fails and retries such a job a minute after a maintenance pass first
  sees it (`IntermediateQueue.cleanup`, run by a live worker every `abandoned_after_s / 2`);
- RETRY_BACK_OFF: an attempt failed (a SIGKILLed worker, Redis restarting) and RQ's `Retry`
  waits out its interval in the scheduled registry;
- ABANDONED: it was running on a worker process the harness SIGKILLed; retried once its
  heartbeat runs out (`[workers] abandoned_after_s`);
- IN_THE_OUTBOX: its answered round still waits in the outbox, because the resumer that read
  the entry died (or lost Redis) before enqueueing the job; a resumer claims it again once it
  has been idle 30 s (`broker.runs.outbox.Resumer`'s `min_idle_ms`).

Anything else (a job queued and not taken, running on a live worker, no job at all, a run that
is gone) is a liveness bug: it is returned as unnamed, and fails the test.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from broker.domain.errors import NotFound
from broker.facade import Broker
from broker.runs.starting import resume_job_id, run_job_id, run_queue

TAKEN_NOT_STARTED = "taken by a worker SIGKILLed before it started the job (RQ: a minute)"
RETRY_BACK_OFF = "waiting out RQ's retry back-off after a failed attempt"
ABANDONED = "running on a SIGKILLed worker until its heartbeat runs out"
IN_THE_OUTBOX = "its round's outbox entry waits to be claimed again (the resumer: 30 s idle)"
LOOKS = 3
LOOK_EVERY_S = 0.2
"""Reads of a run, this far apart, before its state counts as unnamed: a job may move between
registries (scheduled -> queue -> started) while its state is read."""


@dataclass
class Stalls:
    """The drain's stalls: how often each cause held an open run, and what had none."""

    causes: Counter[str] = field(default_factory=Counter)
    unnamed: list[str] = field(default_factory=list)
    count: int = 0

    def note(self, broker: Broker, open_runs: Collection[str], killed_workers: set[int]) -> None:
        """Name why each of `open_runs` is still open (one stall)."""
        self.count += 1
        for run_id in sorted(open_runs):
            for look in range(LOOKS):
                cause, state = why_open(broker, run_id, killed_workers)
                if cause:
                    self.causes[cause] += 1
                    break
                if look < LOOKS - 1:
                    time.sleep(LOOK_EVERY_S)
            else:
                self.unnamed.append(f"stall {self.count}: {run_id}: {state}")


def why_open(broker: Broker, run_id: str, killed_workers: set[int]) -> tuple[str | None, str]:
    """(the named cause or None, the state read) of one open run's current job."""
    try:
        run = broker.get_run(run_id)
    except NotFound:
        return None, "the run is gone"
    if in_the_outbox(broker, run_id):
        return IN_THE_OUTBOX, f"{run.status.value} round {run.round}: in the outbox"
    job_id = run_job_id(run_id) if run.round == 0 else resume_job_id(run_id, run.round)
    queue = run_queue(broker)
    try:
        job = Job.fetch(job_id, connection=queue.connection, serializer=JSONSerializer)
    except NoSuchJobError:
        return None, f"{run.status.value} round {run.round}, pending {run.pending}: no job {job_id}"
    started = set(queue.started_job_registry.get_job_ids(cleanup=False))
    state = (
        f"{run.status.value} round {run.round}: job {job_id} {job.get_status()}, "
        f"worker {job.worker_name}, retries left {job.retries_left}"
    )
    if job_id in queue.scheduled_job_registry.get_job_ids(cleanup=False):
        return RETRY_BACK_OFF, state
    if job_id in started:
        pid = worker_pid(job.worker_name)
        return (ABANDONED if pid in killed_workers else None), f"{state}, started"
    if job_id in queue.intermediate_queue.get_job_ids() and killed_workers:
        return TAKEN_NOT_STARTED, f"{state}, in the intermediate queue"
    return None, state


def in_the_outbox(broker: Broker, run_id: str) -> bool:
    """An entry of the run is still in an outbox stream (entries are deleted once enqueued)."""
    for part in broker.keys.parts():
        for _, fields in broker.redis.xrange(part.resumes, "-", "+"):
            if fields.get(b"run_id", b"").decode() == run_id:
                return True
    return False


def worker_pid(worker_name: str | None) -> int | None:
    """The process id in a slot worker's name (`{pid}.{token}.{slot}`, workers/slots.py)."""
    head = (worker_name or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None
