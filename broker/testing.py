"""Test your agents' approval flows in pytest, without Redis, RQ workers or the API.

`InMemoryBroker` is a real `Broker` (same Lua scripts, same state machine) on fakeredis, with
a synchronous worker: starting a run, or deciding one of its requests, runs the agent right
away until it pauses again or ends. So a test reads like the flow it checks::

    ab = InMemoryBroker()
    ab.register_agent("refunds", refunds_agent, deps=make_deps)
    run = ab.start_run("refunds", "Refund $120 on order A103")
    assert run.status == "waiting"
    [request] = ab.pending(run.id)
    run = ab.approve(request.id, by="alice")
    assert run.status == "finished"

It stands in for the worker fleet with the very code the fleet runs: the runner
(`broker.runs.agent_runner`), the outbox step (`broker.runs.outbox`) and the pending-call and result mapping;
nothing from `workers` is imported, and fakeredis is used here only.
"""

from __future__ import annotations

import time
from importlib.util import find_spec
from typing import Any

from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from broker.domain.config import Config, parse_config
from broker.domain.config_sections import AgentConfig
from broker.domain.models import Decision, Outcome, Request, Run, Status
from broker.facade import Broker
from broker.runs.agent_runner import AgentRunner
from broker.runs.agents import DepsFactory, LocalAgents, register_agent, unregister_agent
from broker.runs.outbox import Resumer
from broker.runs.starting import RESUME_JOB, RUN_JOB, run_queue, start_run

__all__ = ["InMemoryBroker", "SyncWorker"]

TESTING_EXTRA = ("fakeredis", "lupa")
"""What `approval-broker[testing]` brings: fakeredis, and lupa for its Lua (the broker's steps)."""


def _testing_extra_missing() -> str | None:
    """The first module of the testing extra that is not installed, else None."""
    return next((module for module in TESTING_EXTRA if find_spec(module) is None), None)


if (_missing := _testing_extra_missing()) is not None:
    raise ModuleNotFoundError(
        "broker.testing needs the testing extra, which is not installed"
        f" (no module {_missing}): uv add 'approval-broker[testing]'",
        name=_missing,
    )

import fakeredis  # noqa: E402  (after the check: its absence is the one-line error above)


class SyncWorker:
    """Runs queued agent jobs and fully answered rounds in this thread, until none is left."""

    def __init__(self, broker: Broker, local: LocalAgents | None = None) -> None:
        self.broker = broker
        self.runner = AgentRunner(broker, local)
        self.resumer = Resumer(broker, consumer="sync-worker", min_idle_ms=0, block_ms=None)
        self.queue = run_queue(broker)

    def work(self, max_jobs: int = 1000) -> int:
        """Move answered rounds from the outbox to the queue and run every job; returns how many."""
        done = 0
        while done < max_jobs:
            self.resumer.run_once()
            raw = self.broker.redis.lpop(self.queue.key)  # one job id (bytes), or None
            if not isinstance(raw, bytes):
                return done
            job_id = raw.decode()
            job = Job.fetch(job_id, connection=self.broker.redis, serializer=JSONSerializer)
            if job.func_name == RUN_JOB:
                self.runner.advance(str(job.args[0]), 0)
            elif job.func_name == RESUME_JOB:
                self.runner.advance(str(job.args[0]), int(job.args[1]))
            else:
                raise RuntimeError(f"unexpected job {job.func_name!r} on the agent-runs queue")
            job.set_status(JobStatus.FINISHED)
            done += 1
        raise RuntimeError(f"still busy after {max_jobs} jobs: does an agent loop forever?")


class InMemoryBroker(Broker):
    """A broker on fakeredis whose runs advance synchronously (set `autorun=False` to step)."""

    def __init__(
        self,
        config: Config | dict[str, Any] | None = None,
        *,
        prefix: str = "ab:",
        autorun: bool = True,
    ) -> None:
        if isinstance(config, dict):
            config = parse_config(config)
        # the audit trail stays off, as it always was here: no sweeper seals it in memory, and
        # a test of the trail itself runs on a real Redis (tests/integration/test_audit_trail.py)
        config = config or parse_config({})
        config = config.model_copy(
            update={"audit": config.audit.model_copy(update={"enabled": False})}
        )
        redis = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        super().__init__(redis, config, prefix=prefix)
        self.local_agents = LocalAgents()
        self.worker = SyncWorker(self, self.local_agents)
        self.autorun = autorun

    def register_agent(
        self,
        name: str,
        agent: str | Any,
        *,
        deps: str | DepsFactory | None = None,
        queue: str = "default",
        tool_queues: dict[str, str] | None = None,
        max_rounds: int | None = None,
    ) -> AgentConfig:
        """Register an Agent object (or import path) and optional deps factory under `name`."""
        return register_agent(
            self,
            name,
            agent,
            deps=deps,
            queue=queue,
            tool_queues=tool_queues,
            max_rounds=max_rounds,
            local=self.local_agents,
        )

    def unregister_agent(self, name: str) -> None:
        """Forget an agent registered with `register_agent` (object and factory included)."""
        unregister_agent(self, name, local=self.local_agents)

    def start_run(self, agent: str, prompt: str, *, deps: Any = None) -> Run:
        """Start a run; with `autorun` it has already run until it paused or ended."""
        run = start_run(self, agent, prompt, deps=deps)
        return self._settle(run.id)

    def work(self) -> int:
        """Run what is due now (only needed with `autorun=False`)."""
        return self.worker.work()

    def pending(self, run_id: str | None = None) -> list[Request]:
        """Requests waiting for a decision: those of one run's current round, or all of them."""
        if run_id is None:
            return self.list_requests(status=Status.pending, limit=10_000)
        return sorted(self.get_requests(self.get_run(run_id).pending), key=lambda r: r.id)

    def approve(
        self, request_id: str, *, by: str = "tester", metadata: dict[str, Any] | None = None
    ) -> Run:
        return self._answer(request_id, Decision(outcome=Outcome.approved, metadata=metadata), by)

    def reject(
        self,
        request_id: str,
        reason: str | None = None,
        *,
        by: str = "tester",
        metadata: dict[str, Any] | None = None,
    ) -> Run:
        decision = Decision(outcome=Outcome.rejected, reason=reason, metadata=metadata)
        return self._answer(request_id, decision, by)

    def modify(
        self,
        request_id: str,
        args: dict[str, Any],
        *,
        by: str = "tester",
        metadata: dict[str, Any] | None = None,
    ) -> Run:
        decision = Decision(outcome=Outcome.modified, args=args, metadata=metadata)
        return self._answer(request_id, decision, by)

    def answer(
        self,
        request_id: str,
        answer: Any,
        *,
        by: str = "tester",
        metadata: dict[str, Any] | None = None,
    ) -> Run:
        decision = Decision(outcome=Outcome.answered, answer=answer, metadata=metadata)
        return self._answer(request_id, decision, by)

    def expire(self, request_id: str) -> Run | None:
        """Let a request's time run out now: escalated or timed out, as its queue says."""
        request = self.get_request(request_id)
        self.redis.zadd(self.keys.expiry, {request_id: 0}, xx=True)
        self.sweep(now=time.time())
        return self._settle(request.run_id) if request.run_id else None

    def _answer(self, request_id: str, decision: Decision, decided_by: str) -> Run:
        run_id = self.get_request(request_id).run_id
        if run_id is None:
            raise ValueError(f"request {request_id} belongs to no run; use decide()")
        self.decide(request_id, decision, decided_by=decided_by)
        return self._settle(run_id)

    def _settle(self, run_id: str) -> Run:
        if self.autorun:
            self.worker.work()
        return self.get_run(run_id)
