"""The resumer's batch where one Lua step can't do it: a Redis Cluster, or an unexpected RQ.

RQ's jobs live on a Redis of their own on a cluster (`broker.store.rq_redis`), so no single
step can check a run, claim its round and write its job. Instead the jobs' keys are WATCHed,
one pipeline reads whether each run and job exists, one claims the rounds
(`broker.live_wait`), and one MULTI/EXEC enqueues the missing jobs through RQ; a job created in
between aborts the EXEC and the batch is looked at again. The entries are acknowledged in the
same EXEC on a single Redis, right after it on a cluster (a crash in between re-reads them and
finds the jobs: "duplicate"), so a round is never enqueued twice and never lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import WatchError
from rq import Queue

from broker.client import Broker
from broker.keys import RESUMER_GROUP
from broker.live_wait import RESUMER, claim_field
from broker.resume_step import Round, enqueue_resumes
from broker.runs import resume_job_id
from broker.text import as_str

WATCH_TRIES = 20


@dataclass(frozen=True)
class Handled:
    entry_id: str
    run_id: str | None
    round: int | None
    action: str  # "enqueued" | "duplicate" | "live" | "deferred" | "dead-lettered" | "failed"


def enqueue_watched(
    broker: Broker,
    queue: Queue,
    stream: str,
    entries: list[tuple[str, dict[str, str]]],
    rounds: list[Round],
) -> list[Handled]:
    """Claim and enqueue `rounds` (one per entry) and ack their entries, WATCHing the jobs.

    Entries whose run is gone are left out of the answer (and unacknowledged).
    """
    for _ in range(WATCH_TRIES):
        try:
            return _try_batch(broker, queue, stream, entries, rounds)
        except WatchError:  # someone created one of these jobs meanwhile: look again
            continue
    raise RuntimeError(f"the resume jobs kept changing under {WATCH_TRIES} tries")


def _try_batch(
    broker: Broker,
    queue: Queue,
    stream: str,
    entries: list[tuple[str, dict[str, str]]],
    rounds: list[Round],
) -> list[Handled]:
    redis, keys = broker.redis, broker.keys
    rq = broker.store.rq_redis
    apart = rq is not redis  # a cluster: RQ's jobs on their own Redis, acked after
    job_keys = [queue.job_class.key_for(resume_job_id(r, n)) for r, n in rounds]
    with rq.pipeline() as tx:
        tx.watch(*job_keys)
        look = redis.pipeline(transaction=False)
        jobs = rq.pipeline(transaction=False) if apart else look
        for (run_id, _), job_key in zip(rounds, job_keys, strict=True):
            look.exists(keys.run(run_id))
            jobs.exists(job_key)
        seen = look.execute()
        if apart:
            run_exists, job_exists = seen, jobs.execute()
        else:
            run_exists, job_exists = seen[0::2], seen[1::2]
        live = [i for i, ok in enumerate(run_exists) if ok]
        owners = claim_rounds(broker, [rounds[i] for i in live], RESUMER)
        out: list[Handled] = []
        todo: list[Round] = []
        for i, owner in zip(live, owners, strict=True):
            (entry_id, _), (run_id, round_no) = entries[i], rounds[i]
            if owner != RESUMER:
                action = "live"
            elif job_exists[i] or (run_id, round_no) in todo:
                action = "duplicate"
            else:
                action = "enqueued"
                todo.append((run_id, round_no))
            out.append(Handled(entry_id, run_id, round_no, action))
        if not out:
            return []
        tx.multi()
        enqueue_resumes(queue, todo, tx)
        ids = [h.entry_id for h in out]
        acks = redis.pipeline(transaction=False) if apart else tx
        acks.xack(stream, RESUMER_GROUP, *ids)
        acks.xdel(stream, *ids)
        tx.execute()
        if apart:  # after the jobs: a crash between re-reads the entries, found duplicate
            acks.execute()
    return out


def claim_rounds(broker: Broker, rounds: list[Round], who: str) -> list[str | None]:
    """`broker.live_wait.claim` for many rounds in one round trip: each round's owner."""
    if not rounds:
        return []
    pipe = broker.redis.pipeline(transaction=False)
    for run_id, round_no in rounds:
        pipe.hsetnx(broker.keys.run(run_id), claim_field(round_no), who)
        pipe.hget(broker.keys.run(run_id), claim_field(round_no))
    owners = pipe.execute()[1::2]
    return [None if o is None else as_str(o) for o in owners]
