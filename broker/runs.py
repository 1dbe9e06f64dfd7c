"""Starting and following agent runs from an app, a test or the API.

A run is started by enqueueing the agent job by name (`workers.jobs.run_agent`) on the RQ
queue `agent-runs` with RQ's JSON serializer; the broker never imports worker code.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rq import Queue
from rq.serializers import JSONSerializer

from broker.client import Broker
from broker.errors import InvalidInput, NotFound
from broker.models import Run, RunStatus

RUN_QUEUE = "agent-runs"
RUN_JOB = "workers.jobs.run_agent"
RESUME_JOB = "workers.jobs.resume_agent"
FINAL = (RunStatus.finished, RunStatus.failed)


def run_queue(broker: Broker) -> Queue:
    return Queue(RUN_QUEUE, connection=broker.redis, serializer=JSONSerializer)


def known_agents(broker: Broker) -> set[str]:
    """Agents in the config plus those registered at run time (stored in Redis)."""
    registered = {m.decode() for m in broker.redis.smembers(broker.keys.agents)}
    return set(broker.config.agents) | registered


def start_run(broker: Broker, agent: str, prompt: str, *, deps: Any = None) -> Run:
    """Create a run and enqueue its first round on the fleet; returns the run as `queued`."""
    if agent not in known_agents(broker):
        raise NotFound(f"no agent named {agent!r} is registered", code="unknown_agent")
    try:
        deps_json = json.dumps(deps)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"deps must be JSON-serializable: {exc}") from None
    run = broker.create_run(agent, prompt, extra={"deps": deps_json})
    run_queue(broker).enqueue(RUN_JOB, run.id, job_id=f"run-{run.id}-0")
    return run


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
