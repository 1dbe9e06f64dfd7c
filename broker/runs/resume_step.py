"""The resumer's batch: claim the rounds, enqueue the missing resume jobs through RQ, acknowledge.

Per batch of outbox entries, on a single Redis and on a cluster alike:

1. WATCH the resume jobs' keys (on RQ's Redis, `broker.store.handles.rq_redis`);
2. one Lua step (`scripts/resume.lua`, state only) checks each run, leaves a round its live
   job still waits for alone, claims the others for the resumer (`broker.runs.live_wait`) and, on a
   single Redis, reads which jobs exist already (on a cluster one pipeline on RQ's Redis does);
3. one MULTI/EXEC on RQ's Redis: RQ's own `Queue.enqueue_many` of the jobs still missing
   (`Queue.prepare_data` with the deterministic job id `resume-{run}-{round}`), with the
   entries' XACK + XDEL in the same EXEC on a single Redis, right after it on a cluster.

A job another resumer creates after the WATCH (the same round announced twice, taken by two
resumers) aborts the EXEC and the batch is looked at again: now it is a duplicate. A crash
after the claim leaves the round claimed and the entry pending: whoever reclaims it finds the
claim its own and no job, and enqueues it. A crash between the EXEC and a cluster's acks is
re-read and found a duplicate. So a round is never enqueued twice and never lost, and RQ's job
format is RQ's business: nothing here writes an RQ key except through RQ.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from redis.exceptions import WatchError
from rq import Queue

from broker.facade import Broker
from broker.runs.agent_jobs import resume_agent
from broker.runs.live_wait import RESUMER
from broker.runs.starting import _job_options, resume_job_id
from broker.store.keys import RESUMER_GROUP
from broker.tracing import spans as traced

Round = tuple[str, int]  # (run id, round number)
WATCH_TRIES = 20


@dataclass(frozen=True)
class Handled:
    entry_id: str
    run_id: str | None
    round: int | None
    action: str  # "enqueued" | "duplicate" | "live" | "deferred" | "dead-lettered" | "failed"


class ClaimStep:
    """`scripts/resume.lua` on the broker's Redis (called by SHA, loaded again if missing)."""

    def __init__(self, redis: Any) -> None:
        source = (files("broker.store.scripts") / "resume.lua").read_text()
        self._script = redis.register_script(source)

    def run(self, run_keys: list[str], rounds: list[int], job_keys: list[str] | None) -> list[str]:
        """Each round's word: enqueue | duplicate | live | deferred | gone (`resume.lua`)."""
        keys = run_keys + (job_keys or [])
        args: list[Any] = [RESUMER, "1" if job_keys is not None else "0", *rounds]
        return [w.decode() if isinstance(w, bytes) else w for w in self._script(keys, args)]


def enqueue_resumes(
    queue: Queue, rounds: list[Round], pipeline: Any, parents: dict[Round, str] | None = None
) -> None:
    """Queue the resume jobs of `rounds` on `pipeline` with RQ's `enqueue_many`.

    It checks nothing: the caller makes sure none of them exists (see `resume_batch`).
    `parents`: each round's trace, from its outbox entry (`broker.tracing.spans.job_meta`).
    """
    parents = parents or {}
    if rounds:
        datas = [
            Queue.prepare_data(
                resume_agent,
                args=(run_id, round_no),
                **_rq_options(
                    resume_job_id(run_id, round_no),
                    traced.job_meta(run_id, round_no, parents.get((run_id, round_no))),
                ),
            )
            for run_id, round_no in rounds
        ]
        queue.enqueue_many(datas, pipeline=pipeline)


def _rq_options(job_id: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """`broker.runs.starting`'s job options, spelled as `Queue.prepare_data` takes them."""
    options = _job_options(job_id, meta)
    options["timeout"] = options.pop("job_timeout")
    return options


def resume_batch(
    broker: Broker,
    queue: Queue,
    step: ClaimStep,
    stream: str,
    entries: list[tuple[str, dict[str, str]]],
    rounds: list[Round],
) -> list[Handled]:
    """Claim and enqueue `rounds` (one per entry) and ack their entries (see the module).

    Entries whose run is gone are left out of the answer (and unacknowledged); deferred ones
    are in it but stay pending.
    """
    for _ in range(WATCH_TRIES):
        try:
            return _try_batch(broker, queue, step, stream, entries, rounds)
        except WatchError:  # another resumer created one of these jobs meanwhile: look again
            continue
    raise RuntimeError(f"the resume jobs kept changing under {WATCH_TRIES} tries")


def _try_batch(
    broker: Broker,
    queue: Queue,
    step: ClaimStep,
    stream: str,
    entries: list[tuple[str, dict[str, str]]],
    rounds: list[Round],
) -> list[Handled]:
    redis, rq = broker.redis, broker.store.rq_redis
    apart = rq is not redis  # a cluster: RQ's jobs on their own Redis, acked after
    job_keys = [queue.job_class.key_for(resume_job_id(r, n)) for r, n in rounds]
    with rq.pipeline() as tx:
        tx.watch(*job_keys)
        words = _claim(broker, step, rounds, None if apart else job_keys)
        if apart:
            _mark_existing(rq, job_keys, words)
        out: list[Handled] = []
        todo: list[Round] = []
        for (entry_id, _), round_, word in zip(entries, rounds, words, strict=True):
            if word == "gone":
                continue
            if word == "enqueue":
                word = "duplicate" if round_ in todo else "enqueued"
                if word == "enqueued":
                    todo.append(round_)
            out.append(Handled(entry_id, round_[0], round_[1], word))
        acks = [h.entry_id for h in out if h.action != "deferred"]
        if not todo and not acks:
            return out
        tx.multi()
        enqueue_resumes(queue, todo, tx, _parents(entries, rounds))
        after = redis.pipeline(transaction=False) if apart else tx
        if acks:
            after.xack(stream, RESUMER_GROUP, *acks)
            after.xdel(stream, *acks)
        if todo or not apart:
            tx.execute()
        if apart and acks:  # after the jobs: a crash between re-reads the entries: duplicate
            after.execute()
    return out


def _parents(entries: list[tuple[str, dict[str, str]]], rounds: list[Round]) -> dict[Round, str]:
    """Each round's trace, as its outbox entry carries it (written by the deciding step)."""
    return {
        round_: fields["traceparent"]
        for (_, fields), round_ in zip(entries, rounds, strict=True)
        if fields.get("traceparent")
    }


def _claim(
    broker: Broker, step: ClaimStep, rounds: list[Round], job_keys: list[str] | None
) -> list[str]:
    """The step's words for `rounds`: one call per partition of their runs (one slot each on a
    cluster; an outbox holds its own partition's runs, so that is one call)."""
    keys = broker.keys
    groups: dict[int, list[int]] = {}
    for i, (run_id, _) in enumerate(rounds):
        part = keys.partition_of_run(run_id) if keys.partitions > 1 else 0
        groups.setdefault(part, []).append(i)
    words: list[str] = [""] * len(rounds)
    for idx in groups.values():
        got = step.run(
            [keys.run(rounds[i][0]) for i in idx],
            [rounds[i][1] for i in idx],
            None if job_keys is None else [job_keys[i] for i in idx],
        )
        for i, word in zip(idx, got, strict=True):
            words[i] = word
    return words


def _mark_existing(rq: Any, job_keys: list[str], words: list[str]) -> None:
    """On a cluster: a claimed round whose job exists on RQ's Redis is a duplicate."""
    look = [i for i, w in enumerate(words) if w == "enqueue"]
    if not look:
        return
    pipe = rq.pipeline(transaction=False)
    for i in look:
        pipe.exists(job_keys[i])
    for i, exists in zip(look, pipe.execute(), strict=True):
        if exists:
            words[i] = "duplicate"
