"""Advancing one run by one round: run the agent, then pause it, finish it, or fail it.

Every step can be repeated safely, because a job can be retried or re-read from the outbox:

* a job for a round that is no longer the run's current round (or a finished run) does nothing;
* the agent is driven node by node (`Agent.iter`). Before a tool with effects starts, a marker
  is saved (with the first such tool's count, `broker.runs.tool_guard`); as soon as the tools
  have returned, the history so far is saved as a checkpoint. A retry (after a model's 503,
  say) continues from the checkpoint, without the prompt and without the round's deferred
  results, so no tool that already returned runs again;
* a retry that finds the marker instead of a checkpoint (the worker died, or Redis failed, in
  the tool step) takes the step again when no tool with effects had started; when one had, it
  fails the run with a clear error rather than running it a second time; an error raised by
  the tool step itself fails the run at once for the same reason;
* a pause stores the history together with the next round's calls *before* registering them,
  so a job that dies in between registers the same round on its next attempt;
* registering a round is idempotent in the broker (`create_round`).

What a round starts from is one read (`RunStore.read_round`: the run, its history and, for a
resume, the round's requests); each step is one write that appends only the messages it added
(`broker.runs.agent_runner_writes`). What is kept between attempts is `broker.runs.pause`; where
the agent's coroutine runs (the worker's shared loop, or this thread's) is
`broker.runs.agent_loop`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from typing import Any

import httpx
from approval_broker_client.results import RoundNotReady, results_for
from pydantic_ai import CallToolsNode, DeferredToolRequests, ModelRequestNode
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelHTTPError,
    ModelQuotaExceededError,
    ModelRequestRejectedError,
)
from pydantic_ai.messages import ModelMessage
from pydantic_ai.run import AgentRun, AgentRunResult
from pydantic_core import to_jsonable_python
from pydantic_graph import End
from redis.exceptions import AskError, ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.domain.errors import BrokerError, NotFound
from broker.domain.models import Request, RunStatus
from broker.facade import Broker
from broker.runs.agent_loader import AgentLoadError, LoadedAgent, load_agent
from broker.runs.agent_loop import run_sync
from broker.runs.agent_runner_writes import RoundWrites
from broker.runs.agents import LocalAgents
from broker.runs.live_wait import live_deadline, owned_round, served, wait_and_claim
from broker.runs.new_prompt import prompt_field
from broker.runs.pause import CONTINUE, TOOLS, WAITING, Pause, RunLog
from broker.runs.pending_calls import BadCallMetadata, new_requests, tool_schemas
from broker.runs.tool_guard import NO_EFFECT_KINDS, ToolGuard, tools_field
from broker.tracing import telemetry as tracing

log = logging.getLogger("broker.runs.agent_runner")

SKIPPED = "skipped"
_MAX_ERROR = 2000
_RECORD_RETRY_DELAYS = (0.1, 0.4, 1.0, 2.0)
"""Back-off, in seconds, while recording a run's failure keeps hitting a Redis error."""


REDIS_TRANSIENT = (
    RedisConnectionError,
    RedisTimeoutError,
    AskError,  # and MovedError: a slot moved, as while a replica takes over from a dead master
    TryAgainError,
    ClusterDownError,  # and MasterDownError
)
"""Redis errors that pass: a lost connection, a timeout, a Redis Cluster failing over."""


class RunFailed(Exception):
    """A run can't go on; the message is stored as the run's error."""


def is_transient(exc: BaseException) -> bool:
    """Errors worth another attempt later: the network, Redis, or a model provider's hiccup."""
    if isinstance(exc, (*REDIS_TRANSIENT, httpx.TransportError)):
        return True
    if isinstance(exc, ModelAPIError):
        if isinstance(exc, ModelRequestRejectedError | ModelQuotaExceededError):
            return False
        if isinstance(exc, ModelHTTPError):
            return exc.status_code in (408, 425, 429) or exc.status_code >= 500
        return True
    return isinstance(exc, ConnectionError | TimeoutError)


def describe(exc: BaseException) -> str:
    if isinstance(exc, RunFailed | AgentLoadError | RoundNotReady | BadCallMetadata):
        text = str(exc)
    elif isinstance(exc, BrokerError):
        text = exc.detail
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text[:_MAX_ERROR]


def _worker() -> str:
    """This worker process, as a failed run's error names it: `host:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _may_run_tools(agent_run: AgentRun[Any, Any], node: CallToolsNode[Any, Any]) -> bool:
    """Whether this tool step may run user code with effects (function tools).

    Output tools, external calls and calls that wait for approval don't; a step that applies a
    round's decisions does (approved tools run). When in doubt, yes.
    """
    calls = node.model_response.tool_calls
    if not calls:
        return False
    if node.tool_call_results is not None:
        return True
    try:
        manager = agent_run.ctx.deps.tool_manager
        if manager.tools is None:
            return True
        defs = [manager.get_tool_def(call.tool_name) for call in calls]
    except (AttributeError, ValueError):
        return True
    return any(d is not None and d.kind not in NO_EFFECT_KINDS for d in defs)


class AgentRunner:
    """Runs registered agents for runs stored in the broker (used by RQ jobs and broker.testing)."""

    def __init__(
        self, broker: Broker, local: LocalAgents | None = None, *, live_waits: bool = False
    ) -> None:
        self.broker = broker
        self.local = local
        self.live_waits = live_waits  # honour agents' live_wait_s (RQ jobs; not broker.testing)

    def advance(self, run_id: str, round_no: int, *, final_attempt: bool = True) -> str:
        """Run round 0 (the prompt) or resume after round N; returns the run's new status.

        A transient error is raised again for the job to be retried unless this is the final
        attempt; any other error fails the run with the error stored.
        """
        try:  # one round trip: the run, its history and (a resume) the round's requests
            read = self.broker.run_store.read_round(run_id, round_no, requests=round_no > 0)
        except NotFound:
            log.warning("run %s does not exist; nothing to do", run_id)
            return SKIPPED
        fields = read.fields
        status = RunStatus(fields["status"])
        current = int(fields.get("round") or 0)
        owned = owned_round(fields, round_no)  # rounds this job went on with live count
        if current != owned or status in (
            RunStatus.waiting,
            RunStatus.finished,
            RunStatus.failed,
        ):
            log.info("run %s is %s in round %s; job for round %s skipped", run_id, status.value, current, owned)  # fmt: skip
            return SKIPPED
        decided = read.requests
        if owned != round_no:  # a live job went on past the round this job was for
            decided = self.broker.round_requests(run_id, owned) if owned > 0 else None
        try:
            pause = Pause.read(fields, read.log, read.legacy)
            writes = RoundWrites(
                self.broker,
                run_id,
                pause.log if pause is not None else RunLog(),
                running=status is RunStatus.running,
            )
            if pause is not None and pause.stage == WAITING and pause.round == owned + 1:
                self._register(run_id, fields, pause)  # an attempt died after saving
                return RunStatus.waiting.value
            return self._step(run_id, owned, fields, pause, decided, writes)
        except Exception as exc:
            if is_transient(exc) and not final_attempt:
                log.warning("run %s round %s: %s; will retry", run_id, owned, describe(exc))
                raise
            log.warning("run %s failed: %s", run_id, describe(exc))
            self._record_failure(run_id, describe(exc))
            return RunStatus.failed.value

    def _record_failure(self, run_id: str, error: str) -> None:
        """Store the failure, riding out a short Redis outage (else RQ's on_failure tries too)."""
        for delay in (*_RECORD_RETRY_DELAYS, None):
            try:
                self.broker.update_run(run_id, status=RunStatus.failed, error=error)
                return
            except REDIS_TRANSIENT as exc:
                if delay is None:
                    raise
                log.warning("run %s: recording its failure failed (%s); retrying", run_id, exc)
                time.sleep(delay)

    def _start(
        self,
        run_id: str,
        round_no: int,
        fields: dict[str, str],
        pause: Pause | None,
        requests: list[Request] | None,
    ) -> tuple[str | None, list[ModelMessage] | None, list[Request] | None]:
        """Where this attempt starts: (prompt, history, the decided requests it applies).
        `requests`: round `round_no`'s, as read with the run."""
        if pause is not None and pause.round == round_no and pause.stage == TOOLS:
            if not int(fields.get(tools_field(pause.round, pause.messages)) or 0):
                # the worker died in the step, but before any tool with effects started:
                # take the step again from where it began
                decided = None
                if pause.applies:  # it was the step applying round `round_no`'s outcomes
                    decided = requests
                    if decided is None:
                        decided = self.broker.round_requests(run_id, round_no)
                return None, pause.history(), decided
            on = f" on worker {pause.worker}" if pause.worker else ""
            raise RunFailed(
                f"run {run_id} was interrupted in round {round_no} while its tools were running"
                f"{on} (the worker died, or Redis failed before their results were saved); tools "
                "are never run twice, so the run was stopped"
            )
        if pause is not None and pause.round == round_no and pause.stage == CONTINUE:
            return None, pause.history(), None  # the tools returned: go on from there
        if round_no == 0:
            return fields.get("prompt", ""), None, None
        if pause is None or pause.round != round_no or pause.stage != WAITING:
            raise RunFailed(f"the stored history of run {run_id} round {round_no} is missing")
        prompt = fields.get(prompt_field(round_no)) or None  # a new prompt instead of answers
        if requests is None:
            requests = self.broker.round_requests(run_id, round_no)
        return prompt, pause.history(), requests

    def _step(
        self,
        run_id: str,
        round_no: int,
        fields: dict[str, str],
        pause: Pause | None,
        requests: list[Request] | None,
        writes: RoundWrites,
    ) -> str:
        prompt, history, decided = self._start(run_id, round_no, fields, pause, requests)
        results = results_for(decided) if decided is not None else None
        loaded = load_agent(self.broker, fields["agent"], self.local)
        deps = loaded.deps(self.broker, run_id, json.loads(fields.get("deps") or "null"))
        kwargs: dict[str, Any] = {"deps": deps}
        if loaded.output_type is not None:
            kwargs["output_type"] = loaded.output_type
        if history is not None:
            kwargs["message_history"] = history
        if results is not None:
            kwargs["deferred_tool_results"] = results
        applying = results is not None
        if not applying and not writes.running:  # the model is first: say so now, on this thread
            writes.write(None)
        guard = ToolGuard(self.broker, writes, kept=fields, approved=decided)
        drive = self._drive(run_id, round_no, loaded, guard, prompt, kwargs, applying)
        result = run_sync(tracing.carry(drive))  # the job's trace, on the worker's shared loop
        output = result.output
        if isinstance(output, DeferredToolRequests):
            messages = result.all_messages()
            return self._pause(run_id, round_no + 1, loaded, fields, output, messages, writes)
        return RunStatus.finished.value  # written by `_drive`

    async def _drive(
        self,
        run_id: str,
        round_no: int,
        loaded: LoadedAgent,
        guard: ToolGuard,
        prompt: str | None,
        kwargs: dict[str, Any],
        applying: bool,
    ) -> AgentRunResult[Any]:
        """Run the agent to its end: a marker before the first tool with effects of a step
        starts (the guard writes it), a checkpoint once a step's tools returned, and the run's
        end (`finished`, its output) when the agent returns one instead of deferred calls.

        `applying`: this attempt starts by applying the round's outcomes; the first marker says
        so, so a step taken again applies them again.
        """
        writes = guard.writes
        try:
            async with loaded.agent.iter(prompt, capabilities=[guard], **kwargs) as agent_run:
                node = agent_run.next_node
                while not isinstance(node, End):
                    if not (isinstance(node, CallToolsNode) and _may_run_tools(agent_run, node)):
                        if isinstance(node, ModelRequestNode) and not writes.says_running:
                            writes.ahead(None)  # `running`, committed while the model works
                        node = await agent_run.next(node)
                        continue
                    messages = agent_run.all_messages()
                    marker = Pause(round_no, TOOLS, worker=_worker(), applies=applying)
                    applying = False
                    guard.arm(tools_field(round_no, len(messages)), marker, messages)
                    try:
                        node = await agent_run.next(node)
                    except Exception as exc:
                        if not is_transient(exc):
                            raise
                        raise RunFailed(
                            f"{describe(exc)} (raised while the tools of round {round_no} ran; "
                            "they are not run a second time, so the run was stopped)"
                        ) from exc
                    finally:
                        guard.disarm()
                    if isinstance(node, ModelRequestNode):  # the tools returned; the model next
                        checkpoint = Pause(round_no, CONTINUE)
                        writes.ahead(checkpoint, [*agent_run.all_messages(), node.request])
                result = agent_run.result
        except BaseException:
            await writes.drain(quiet=True)
            raise
        await writes.drain()  # the writes sent ahead are in before the run goes on
        if result is None:  # pragma: no cover - an End node always carries the result
            raise RunFailed(f"the agent of run {run_id} ended without a result")
        if not isinstance(result.output, DeferredToolRequests):  # the end, on this loop
            output = json.dumps(to_jsonable_python(result.output, fallback=str))
            await writes.finish(round_no, output)
        return result

    def _pause(
        self,
        run_id: str,
        next_round: int,
        loaded: LoadedAgent,
        fields: dict[str, str],
        output: DeferredToolRequests,
        messages: list[ModelMessage],
        writes: RoundWrites,
    ) -> str:
        limit = loaded.spec.max_rounds
        if next_round > limit:
            raise RunFailed(
                f"agent {loaded.name!r} asked for decisions again after {limit} rounds "
                f"(max_rounds = {limit}); the run was stopped"
            )
        queues = self.broker.config.queues
        schemas = tool_schemas(loaded.agent)
        calls = new_requests(output, loaded.spec, messages, queues=queues, schemas=schemas)
        for call in calls:
            if call.queue not in queues:
                raise RunFailed(
                    f"tool {call.tool_name!r} routes its request to queue {call.queue!r}, "
                    "which is not defined"
                )
        pause = Pause(next_round, WAITING, calls=[c.model_dump(mode="json") for c in calls])
        waits = served()
        live = waits.seconds(loaded.spec.live_wait_s) if self.live_waits else 0
        with contextlib.ExitStack() as held:
            # a place to wait in, taken before the pause is written (a slot is held meanwhile)
            free = live > 0 and held.enter_context(waits.place())
            until = time.time() + live if free else None
            # the pause before registering: a retry registers the same round; with it the live
            # wait's deadline, so a decision that completes the round sees the wait (decide.lua)
            writes.write(
                pause, messages, fields=live_deadline(next_round, until) if until else None
            )
            made = self._register(run_id, fields, pause)
            ids = [r.id for r in made]
            # the round, claimed with what it goes on with in the step that found it complete;
            # None: not in time, or the resumer's (its resume job goes on with the round)
            claimed = (
                wait_and_claim(self.broker, run_id, next_round, live, until=until, request_ids=ids)
                if until is not None
                else None
            )
        status = RunStatus.waiting.value
        if claimed is not None:
            decided, fields = claimed.requests, claimed.fields
            pause.kept = messages  # the history it paused on, as it is (no trip through JSON)
            writes.running = False  # the round's outcomes made it `queued` again
            return self._step(run_id, next_round, fields, pause, decided, writes)
        return status

    def _register(self, run_id: str, fields: dict[str, str], pause: Pause) -> list[Request]:
        """Register the round `pause` waits on; its requests. `fields`: the run's, as this job
        read them (its agent and starter never change). The step that registers the round also
        announces the pause to the run's long-polls (create.lua)."""
        # the run's starter asked for these calls: none of them counts their approval
        starter = fields.get("started_by") or None
        calls = [c.model_copy(update={"created_by": starter}) for c in pause.requests()]
        return self.broker.create_round(run_id, pause.round, calls, agent=fields.get("agent"))
