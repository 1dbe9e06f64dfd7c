"""Advancing one run by one round: run the agent, then pause it, finish it, or fail it.

Every step can be repeated safely, because a job can be retried or re-read from the outbox:

* a job for a round that is no longer the run's current round (or a finished run) does nothing;
* a pause stores the messages together with the next round's calls *before* registering them,
  so a job that dies in between registers the same round on its next attempt;
* registering a round is idempotent in the broker (`create_round`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic_ai import DeferredToolRequests
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelHTTPError,
    ModelQuotaExceededError,
    ModelRequestRejectedError,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_core import to_jsonable_python
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.agent_loader import AgentLoadError, LoadedAgent, load_agent
from broker.agents import LocalAgents
from broker.client import Broker
from broker.errors import BrokerError, NotFound
from broker.models import NewRequest, RunStatus
from broker.pending_calls import new_requests
from broker.results import RoundNotReady, results_for

log = logging.getLogger("broker.runner")

SKIPPED = "skipped"
_MAX_ERROR = 2000


class RunFailed(Exception):
    """A run can't go on; the message is stored as the run's error."""


def is_transient(exc: BaseException) -> bool:
    """Errors worth another attempt later: the network, Redis, or a model provider's hiccup."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | httpx.TransportError):
        return True
    if isinstance(exc, ModelAPIError):
        if isinstance(exc, ModelRequestRejectedError | ModelQuotaExceededError):
            return False
        if isinstance(exc, ModelHTTPError):
            return exc.status_code in (408, 425, 429) or exc.status_code >= 500
        return True
    return isinstance(exc, ConnectionError | TimeoutError)


def describe(exc: BaseException) -> str:
    if isinstance(exc, RunFailed | AgentLoadError | RoundNotReady):
        text = str(exc)
    elif isinstance(exc, BrokerError):
        text = exc.detail
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text[:_MAX_ERROR]


@dataclass
class Pause:
    """What a paused run keeps in Redis: the history so far and the round it waits on."""

    round: int
    messages: list[Any]
    calls: list[dict[str, Any]] = field(default_factory=list)

    def dump(self) -> bytes:
        return json.dumps(
            {"round": self.round, "messages": self.messages, "calls": self.calls}
        ).encode()

    @classmethod
    def load(cls, raw: bytes | None) -> Pause | None:
        if not raw:
            return None
        data = json.loads(raw)
        if not isinstance(data, dict) or "round" not in data:
            return None  # not written by this module
        return cls(int(data["round"]), data.get("messages") or [], data.get("calls") or [])

    def history(self) -> list[ModelMessage]:
        return ModelMessagesTypeAdapter.validate_python(self.messages)

    def requests(self) -> list[NewRequest]:
        return [NewRequest.model_validate(c) for c in self.calls]


def _output_types(agent: Any) -> list[Any]:
    declared = getattr(agent, "output_type", None)
    if isinstance(declared, Sequence) and not isinstance(declared, str):
        return list(declared)
    return [declared]


class AgentRunner:
    """Runs registered agents for runs stored in the broker (used by RQ jobs and broker.testing)."""

    def __init__(self, broker: Broker, local: LocalAgents | None = None) -> None:
        self.broker = broker
        self.local = local

    def advance(self, run_id: str, round_no: int, *, final_attempt: bool = True) -> str:
        """Run round 0 (the prompt) or resume after round N; returns the run's new status.

        A transient error is raised again for the job to be retried unless this is the final
        attempt; any other error fails the run with the error stored.
        """
        try:
            fields = self.broker.run_fields(run_id)
        except NotFound:
            log.warning("run %s does not exist; nothing to do", run_id)
            return SKIPPED
        status = RunStatus(fields["status"])
        current = int(fields.get("round") or 0)
        if current != round_no or status in (
            RunStatus.waiting,
            RunStatus.finished,
            RunStatus.failed,
        ):
            log.info("run %s is %s in round %s; job for round %s skipped", run_id, status.value, current, round_no)  # fmt: skip
            return SKIPPED
        try:
            pause = Pause.load(self.broker.load_messages(run_id))
            if pause is not None and pause.round == round_no + 1:
                return self._register(run_id, pause)  # an earlier attempt died after saving
            return self._step(run_id, round_no, fields, pause)
        except Exception as exc:
            if is_transient(exc) and not final_attempt:
                log.warning("run %s round %s: %s; will retry", run_id, round_no, describe(exc))
                raise
            log.warning("run %s failed: %s", run_id, describe(exc))
            self.broker.update_run(run_id, status=RunStatus.failed, error=describe(exc))
            return RunStatus.failed.value

    def _step(self, run_id: str, round_no: int, fields: dict[str, str], pause: Pause | None) -> str:
        loaded = load_agent(self.broker, fields["agent"], self.local)
        deps = loaded.deps(self.broker, run_id, json.loads(fields.get("deps") or "null"))
        kwargs: dict[str, Any] = {"deps": deps}
        if DeferredToolRequests not in _output_types(loaded.agent) and not getattr(
            loaded.agent, "_output_validators", None
        ):
            kwargs["output_type"] = [*_output_types(loaded.agent), DeferredToolRequests]
        if round_no == 0:
            prompt: str | None = fields.get("prompt", "")
        else:
            if pause is None or pause.round != round_no:
                raise RunFailed(f"the stored history of run {run_id} round {round_no} is missing")
            kwargs["message_history"] = pause.history()
            kwargs["deferred_tool_results"] = results_for(
                self.broker.round_requests(run_id, round_no)
            )
            prompt = None
        self.broker.update_run(run_id, status=RunStatus.running)
        result = loaded.agent.run_sync(prompt, **kwargs)
        output = result.output
        if isinstance(output, DeferredToolRequests):
            return self._pause(run_id, round_no + 1, loaded, output, result.all_messages())
        self.broker.update_run(
            run_id,
            status=RunStatus.finished,
            output=json.dumps(to_jsonable_python(output, fallback=str)),
            error="",
        )
        return RunStatus.finished.value

    def _pause(
        self,
        run_id: str,
        next_round: int,
        loaded: LoadedAgent,
        output: DeferredToolRequests,
        messages: list[ModelMessage],
    ) -> str:
        limit = loaded.spec.max_rounds
        if next_round > limit:
            raise RunFailed(
                f"agent {loaded.name!r} asked for decisions again after {limit} rounds "
                f"(max_rounds = {limit}); the run was stopped"
            )
        calls = new_requests(output, loaded.spec, messages)
        for call in calls:
            if call.queue not in self.broker.config.queues:
                raise RunFailed(
                    f"tool {call.tool_name!r} routes its request to queue {call.queue!r}, "
                    "which is not defined"
                )
        pause = Pause(
            round=next_round,
            messages=json.loads(ModelMessagesTypeAdapter.dump_json(messages)),
            calls=[c.model_dump(mode="json") for c in calls],
        )
        self.broker.save_messages(run_id, pause.dump())
        return self._register(run_id, pause)

    def _register(self, run_id: str, pause: Pause) -> str:
        self.broker.create_round(run_id, pause.round, pause.requests())
        return RunStatus.waiting.value
