"""A new prompt instead of answers (`POST /v1/runs/{run_id}/messages`).

The person moved on: every call the run still waits for gets the outcome `rejected` with the
reason "The user did not answer" (decided by whoever sent the prompt), and the round resumes
as usual (outbox, one resume job) with the prompt added to the model's next request. An agent
configured with `unanswered = "raise"` refuses instead (409). The prompt is stored on the run,
under the round it answers, before any call is rejected, so the resume job always finds it.
"""

from __future__ import annotations

from typing import Any

from broker.domain.errors import Conflict
from broker.domain.models import Decision, Outcome, Run, RunStatus
from broker.facade import Broker
from broker.runs.agents import agent_spec

UNANSWERED = "The user did not answer"


def prompt_field(round_no: int) -> str:
    """The run-hash field holding the prompt to resume round `round_no` with."""
    return f"prompt:{round_no}"


def continue_with_prompt(broker: Broker, run_id: str, prompt: str, *, by: str) -> Run:
    """Reject the run's waiting calls and resume it with `prompt`; returns the run.

    Raises NotFound, or Conflict (code `not_waiting`, or `unanswered_raise` for an agent that
    must be answered) with the run's state as `request`.
    """
    run = broker.get_run(run_id)
    if agent_spec(broker, run.agent).unanswered == "raise":
        raise Conflict(
            f'agent {run.agent!r} has unanswered = "raise": answer its pending calls instead',
            request=None,
            code="unanswered_raise",
        )
    key = broker.keys.run(run_id)
    stored = False

    def store_if_waiting(pipe: Any) -> None:
        nonlocal stored
        status, round_raw = pipe.hmget(key, "status", "round")
        stored = status == RunStatus.waiting.value.encode() and int(round_raw or 0) == run.round
        pipe.multi()
        if stored:
            pipe.hset(key, prompt_field(run.round), prompt)

    broker.redis.transaction(store_if_waiting, key)
    if not stored:
        current = broker.get_run(run_id)
        raise Conflict(
            f"run {run_id} is {current.status.value}, not waiting for answers",
            request=None,
            code="not_waiting",
        )
    rejected = Decision(outcome=Outcome.rejected, reason=UNANSWERED)
    for request_id in run.pending:
        try:
            broker.decide(request_id, rejected, decided_by=by)
        except Conflict:
            pass  # someone answered it meanwhile: their answer stands
    return broker.get_run(run_id)
