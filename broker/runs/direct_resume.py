"""The deciding API process enqueues a round's resume job itself, right after the step.

Without this a decision's resume goes API -> outbox stream -> resumer process -> RQ: a process
hop (a wake-up, a read, a claim step) before RQ even has the job. With it, the decide step that
completes a round for a caller on the judge's async face (`broker.judge.Judge.adecide`, the
API's hot routes) also claims the round for the resume job (`claimed:N`, as the resumer's
claim step does) and writes its outbox entry to `resumes_direct`; the API then enqueues the job
with RQ's own unique enqueue (`Queue.enqueue(..., unique=True)`: one atomic check, save and
push) and deletes the entry.

The outbox stays the recovery path: an API that dies between its step and its enqueue leaves
the entry, and the resumers read `resumes_direct` too, taking an entry only once it is older
than a grace (`broker.runs.outbox.DIRECT_GRACE_S`), so they never race a live API for it. Either
way the round is enqueued exactly once: the claim is the resumer's (`resumer`) and both run
the same batch step, which WATCHes the job's key (a job the other made meanwhile makes the
entry a duplicate). A round a live job still waits for is not claimed in the
step and not handed here: the resumers deal with it as before.

The jobs go out from a thread (RQ's client is synchronous), a batch per hop: the decisions that
complete rounds while one batch is out are the next batch. A decision is answered once its
round's job is in (or was left to the resumers after an error): when a client has its 200, the
run's resume is on RQ.
"""

from __future__ import annotations

import asyncio
import logging

import anyio.to_thread
from rq import Queue

from broker.facade import Broker
from broker.runs.live_wait import RESUMER
from broker.runs.resume_step import ClaimStep, resume_batch
from broker.runs.starting import run_queue
from broker.store.decide_step import Resume

log = logging.getLogger("broker.runs.direct_resume")


class DirectResumes:
    """The API's sink for completed rounds (`broker.judge.ResumeSink`): `resume` on the event
    loop, the jobs enqueued from a thread, batch by batch."""

    claimant = RESUMER

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._queue: Queue | None = None
        self._step: ClaimStep | None = None
        self._waiting: list[tuple[Resume, asyncio.Future[None]]] = []
        self._sending: asyncio.Task[None] | None = None

    async def resume(self, resume: Resume) -> None:
        """Enqueue `resume`'s job, with whatever else is waiting, and return once it is in
        (or left to the resumers: an error is logged, never raised)."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((resume, done))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.get_running_loop().create_task(self._send())
        await asyncio.shield(done)  # a caller that goes away doesn't cancel the batch

    async def _send(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await anyio.to_thread.run_sync(self.enqueue, [r for r, _ in batch])
            except Exception:  # noqa: BLE001 - the entries stay: the resumers take them
                log.warning(
                    "could not enqueue %d resume job(s); the resumer will",
                    len(batch),
                    exc_info=True,
                )
            for _, done in batch:
                if not done.done():
                    done.set_result(None)

    def enqueue(self, batch: list[Resume]) -> list[bool]:
        """Enqueue each round's resume job unless it exists, and delete the entries (sync).

        The resumer's own batch step (`broker.runs.resume_step.resume_batch`: the job keys
        WATCHed, the claim step, which finds the rounds claimed already and reads which jobs
        exist, then RQ's `enqueue_many` and the entries' deletion in one MULTI/EXEC): one write
        for the batch. Returns, per round, whether this call made its job.
        """
        made: dict[str, bool] = {}
        by_stream: dict[str, list[Resume]] = {}
        for resume in batch:
            by_stream.setdefault(resume.stream, []).append(resume)
        for stream, resumes in by_stream.items():
            entries = [(r.entry_id, _fields(r)) for r in resumes]
            rounds = [(r.run_id, r.round) for r in resumes]
            for handled in resume_batch(
                self.broker, self.queue, self.step, stream, entries, rounds
            ):
                made[handled.entry_id] = handled.action == "enqueued"
        return [made.get(r.entry_id, False) for r in batch]

    @property
    def step(self) -> ClaimStep:
        if self._step is None:
            self._step = ClaimStep(self.broker.redis)
        return self._step

    @property
    def queue(self) -> Queue:
        """RQ's queue, made once (RQ asks Redis for its version once per Queue object)."""
        if self._queue is None:
            self._queue = run_queue(self.broker)
        return self._queue

    async def aclose(self) -> None:
        """Wait for the batch on its way (what is left is the resumers' anyway)."""
        if self._sending is not None and not self._sending.done():
            await asyncio.wait([self._sending], timeout=5)


def _fields(resume: Resume) -> dict[str, str]:
    """The round's outbox entry, as the resumer would read it."""
    fields = {"run_id": resume.run_id, "round": str(resume.round)}
    if resume.traceparent:
        fields["traceparent"] = resume.traceparent
    return fields
