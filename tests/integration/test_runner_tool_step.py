"""A worker that died inside a tool step: the step is taken again only if no tool had started.

The runner marks a step that may run tools as its first tool with effects starts, counting
each such tool (`broker.runs.tool_guard.ToolGuard`); the checkpoint after the step holds what
the tools returned. Here the marker a dead worker left is written as the runner writes it
(`RoundWrites`), from a real agent run stopped just before its tool step; the next attempt (an
in-process RQ worker) takes the step again when the count is zero (the run pauses for approval
and later finishes with the tool run once), and fails the run when a tool had started. A run
marked by the version that kept each tool's return in the run's hash (its whole history in one
string) gives those returns back.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic_ai import CallToolsNode
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ToolReturnPart

from broker.domain.models import Decision, RunStatus
from broker.facade import Broker
from broker.runs.agent_runner_writes import RoundWrites
from broker.runs.agents import register_agent
from broker.runs.pause import CONTINUE, TOOLS, Pause, RunLog
from broker.runs.starting import enqueue_resume, start_run
from broker.runs.tool_guard import returned_field, tools_field
from tests.support.agents import Recorder, recorder_for
from tests.support.jobs import work
from tests.support.slot_agents import refund_agent

SUPPORT = "tests.support.slot_agents"


async def _messages_before_the_tool_step(recorder: Recorder) -> list[ModelMessage]:
    async with refund_agent.iter("Refund A1.", deps=recorder) as agent_run:
        node = agent_run.next_node
        while not isinstance(node, CallToolsNode):
            node = await agent_run.next(node)
        return agent_run.all_messages()


def _died_in_the_step(broker: Broker, recorder: Recorder, tools_started: int) -> str:
    register_agent(broker, "refund", f"{SUPPORT}:refund_agent", deps="tests.support.agents:make_recorder")  # fmt: skip
    run = start_run(broker, "refund", "Refund A1.")
    messages = asyncio.run(_messages_before_the_tool_step(recorder))
    marker = Pause(0, TOOLS, worker="worker-host:4242")
    count = {tools_field(0, len(messages)): str(tools_started)}
    RoundWrites(broker, run.id, RunLog(), running=False).write(marker, messages, fields=count)
    return run.id


@pytest.fixture
def recorder(bound: Broker) -> Recorder:
    return recorder_for(bound.redis, bound.keys.prefix)


def test_a_step_where_no_tool_had_started_is_taken_again_and_the_run_goes_on(
    bound: Broker, recorder: Recorder
) -> None:
    run_id = _died_in_the_step(bound, recorder, tools_started=0)
    work(bound)
    run = bound.get_run(run_id)
    assert run.status is RunStatus.waiting, run.error  # the refund asks for approval again
    bound.decide(run.pending[0], Decision(outcome="approved"), decided_by="ann")
    enqueue_resume(bound, run_id, 1)
    work(bound)
    assert bound.get_run(run_id).status is RunStatus.finished
    assert [c["tool"] for c in recorder.all()] == ["refund"]


def test_a_step_where_a_tool_had_started_fails_the_run_rather_than_run_it_twice(
    bound: Broker, recorder: Recorder
) -> None:
    run_id = _died_in_the_step(bound, recorder, tools_started=1)
    work(bound)
    run = bound.get_run(run_id)
    assert run.status is RunStatus.failed
    assert "interrupted in round 0 while its tools were running on worker worker-host:4242 " in (
        run.error or ""
    )
    assert recorder.all() == []


def _died_after_the_approved_tool_returned(broker: Broker, kept: str) -> tuple[str, str]:
    """A run whose approved refund ran in round 1's step, the worker dying before the step's
    end, as the version that kept each tool's return in the run's hash left it: its whole
    history and stage in one string, the count back to zero, the refund's return kept."""
    register_agent(broker, "refund", f"{SUPPORT}:refund_agent", deps="tests.support.agents:make_recorder")  # fmt: skip
    run = start_run(broker, "refund", "Refund A1.")
    work(broker)
    waiting = broker.get_run(run.id)
    assert waiting.status is RunStatus.waiting, waiting.error
    broker.decide(waiting.pending[0], Decision(outcome="approved"), decided_by="ann")
    fields = broker.run_fields(run.id)
    pause = Pause.read(fields, broker.redis.lrange(broker.keys.run_log(run.id), 0, -1), None)
    assert pause is not None
    call_id = pause.calls[0]["tool_call_id"]
    messages = json.loads(pause.history_json)
    old_marker = {"round": 1, "stage": TOOLS, "messages": messages, "calls": pause.calls}
    broker.redis.delete(broker.keys.run_log(run.id))
    broker.redis.hdel(broker.keys.run(run.id), "stage")
    broker.save_messages(run.id, json.dumps(old_marker).encode())
    step = tools_field(1, len(messages))
    old_fields = {step: 0, returned_field(step, call_id): kept}
    broker.redis.hset(broker.keys.run(run.id), mapping=old_fields)
    return run.id, call_id


def _tool_returns(broker: Broker, run_id: str, call_id: str) -> list[Any]:
    history = ModelMessagesTypeAdapter.validate_json(broker.load_messages(run_id) or b"[]")
    return [
        part.content
        for message in history
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart) and part.tool_call_id == call_id
    ]


def test_a_run_marked_the_old_way_gives_back_a_kept_return_on_the_retry_and_moves_to_the_log(
    bound: Broker, recorder: Recorder
) -> None:
    run_id, call_id = _died_after_the_approved_tool_returned(bound, kept='"refunded (kept)"')
    enqueue_resume(bound, run_id, 1)
    work(bound)
    run = bound.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    assert recorder.all() == []  # the refund was not run a second time
    assert _tool_returns(bound, run_id, call_id) == ["refunded (kept)"]
    assert bound.redis.llen(bound.keys.run_log(run_id)) >= 1  # its history is in the log now


def test_an_approved_tool_that_returns_is_checkpointed_with_its_return_in_the_log(
    bound: Broker, recorder: Recorder
) -> None:
    register_agent(bound, "refund", f"{SUPPORT}:refund_agent", deps="tests.support.agents:make_recorder")  # fmt: skip
    run = start_run(bound, "refund", "Refund A1.")
    work(bound)
    bound.decide(bound.get_run(run.id).pending[0], Decision(outcome="approved"), decided_by="ann")
    enqueue_resume(bound, run.id, 1)
    work(bound)
    assert bound.get_run(run.id).status is RunStatus.finished
    fields = bound.run_fields(run.id)
    stage = json.loads(fields["stage"])
    assert (stage["round"], stage["stage"]) == (1, CONTINUE)  # the checkpoint after the step
    [call_id] = [r.tool_call_id for r in bound.round_requests(run.id, 1)]
    assert _tool_returns(bound, run.id, call_id) == ["refunded"]
    assert not [k for k in fields if k.startswith("tools:1:") and k.count(":") > 2]  # none kept
    assert [c["tool"] for c in recorder.all()] == ["refund"]
