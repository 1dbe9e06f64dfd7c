"""Starting and following agent runs from an app, a test or the API.

A run is started by enqueueing its job (`broker.runs.agent_jobs.run_agent`) on the RQ queue `agent-runs`
with RQ's JSON serializer; the broker never imports worker code, and names each job by its
function, never by a string. A fully answered round is resumed by `broker.runs.agent_jobs.resume_agent`
under the job id `resume-{run_id}-{round}`, so the same round can never be enqueued twice.

Every job carries `on_failure=Callback(broker.runs.agent_jobs.mark_failed)`: when its last attempt ends
without the runner recording the outcome (RQ finds it abandoned, or recording failed), the run
is failed instead of staying `running`. A worker process killed outright (SIGKILL, out of
memory) runs no callback: its jobs stop beating, RQ finds them abandoned and retries them, and
on the last attempt runs this callback (workers/slots.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

from rq import Callback, Queue, Retry
from rq.exceptions import DuplicateJobError
from rq.serializers import JSONSerializer

from broker.domain.errors import InvalidInput, NotFound
from broker.domain.models import Run, RunStatus
from broker.facade import Broker
from broker.redis.cluster import wait_for_replicas
from broker.redis.replies import as_fields, as_str
from broker.runs.agent_jobs import RESUME_JOB, RUN_JOB, mark_failed, resume_agent, run_agent
from broker.store.run_state import run_from
from broker.tracing import spans as traced

__all__ = [
    "FINAL",
    "RESUME_JOB",
    "RUN_JOB",
    "RUN_QUEUE",
    "enqueue_resume",
    "is_known_agent",
    "known_agents",
    "resume_job_id",
    "run_job_id",
    "run_queue",
    "start_run",
    "wait_run",
]

RUN_QUEUE = "agent-runs"
FINAL = (RunStatus.finished, RunStatus.failed)

RETRY_INTERVALS: list[int] = [2, 10, 60]
"""Back-off, in seconds, before the attempts after a transient error (model or network)."""
JOB_TIMEOUT_S = 900
JOB_RESULT_TTL_S = 7 * 86400
"""How long a finished job's id stays taken: a stale outbox entry re-read later is refused."""


def run_queue(broker: Broker) -> Queue:
    """RQ's queue, on RQ's own Redis when the broker's is a cluster (`broker.redis.cluster`)."""
    return Queue(RUN_QUEUE, connection=broker.store.rq_redis, serializer=JSONSerializer)


def run_job_id(run_id: str) -> str:
    return f"run-{run_id}-0"


def resume_job_id(run_id: str, round_no: int) -> str:
    return f"resume-{run_id}-{round_no}"


def _job_options(job_id: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """RQ's options for a job of a run; `meta` carries its trace (`broker.tracing.spans.job_meta`)."""
    return {
        **({"meta": meta} if meta else {}),
        "job_id": job_id,
        "retry": Retry(max=len(RETRY_INTERVALS), interval=RETRY_INTERVALS),
        "job_timeout": JOB_TIMEOUT_S,
        "result_ttl": JOB_RESULT_TTL_S,
        "failure_ttl": JOB_RESULT_TTL_S,
        "on_failure": Callback(mark_failed),
    }


def known_agents(broker: Broker) -> set[str]:
    """Agents in the config plus those registered at run time (stored in Redis)."""
    registered = {as_str(m) for m in broker.redis.smembers(broker.keys.agents)}
    return set(broker.config.agents) | registered


def is_known_agent(broker: Broker, name: str) -> bool:
    """Whether `name` is in the config or registered at run time: Redis is asked (one
    SISMEMBER) only for an agent the config doesn't have."""
    return name in broker.config.agents or bool(broker.redis.sismember(broker.keys.agents, name))


def unknown_agent(name: str, known: set[str]) -> str:
    """`no agent named 'x' is registered (known: a, b)`: what to start instead."""
    return f"no agent named {name!r} is registered (known: {', '.join(sorted(known)) or 'none'})"


def start_run(
    broker: Broker, agent: str, prompt: str, *, deps: Any = None, started_by: str | None = None
) -> Run:
    """Create a run and enqueue its first round on the fleet; returns the run as `queued`.

    `deps` is JSON: the agent's deps factory gets it (without a factory, it is the deps).
    `started_by` (the API caller who started it) is kept: each request of the run records it,
    and the starter never counts as an approver of them.
    """
    if not is_known_agent(broker, agent):
        raise NotFound(unknown_agent(agent, known_agents(broker)), code="unknown_agent")
    if not isinstance(prompt, str):
        raise InvalidInput("prompt must be a string")
    try:
        deps_json = json.dumps(deps)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"deps must be JSON-serializable: {exc}") from None
    # the run and its first job in one MULTI/EXEC: a crash or outage leaves both or neither
    extra = {"deps": deps_json, **({"started_by": started_by} if started_by else {})}
    fields = broker.run_store.new_run_fields(agent, prompt, extra=extra)
    run_id = fields["id"]
    options = _job_options(run_job_id(run_id), traced.job_meta(run_id, 0))
    if broker.store.clustered:  # two Redis: the run first (and replicated), then its job
        broker.redis.hset(broker.keys.run(run_id), mapping=as_fields(fields))
        wait_for_replicas(broker.redis, broker.keys.run(run_id), strict=False)
        run_queue(broker).enqueue(run_agent, run_id, **options)
    else:
        with broker.redis.pipeline() as pipe:
            run_queue(broker).enqueue(run_agent, run_id, pipeline=pipe, **options)
            pipe.hset(broker.keys.run(run_id), mapping=as_fields(fields))
            pipe.execute()
    return run_from(run_id, fields, [])  # as written: not read back (a worker may be on it)


def enqueue_resume(broker: Broker, run_id: str, round_no: int) -> bool:
    """Enqueue the resume of one round, once: False when that job already exists."""
    try:
        run_queue(broker).enqueue(
            resume_agent,
            run_id,
            round_no,
            unique=True,
            **_job_options(resume_job_id(run_id, round_no), traced.job_meta(run_id, round_no)),
        )
    except DuplicateJobError:
        return False
    return True


def wait_run(
    broker: Broker, run_id: str, *, timeout: float = 60.0, until: tuple[RunStatus, ...] = FINAL
) -> Run:
    """Poll until the run reaches one of `until` (default: finished or failed)."""
    deadline = time.monotonic() + timeout
    while True:
        run = broker.get_run(run_id)
        if run.status in until:
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} is still {run.status.value} after {timeout}s")
        time.sleep(0.05)
