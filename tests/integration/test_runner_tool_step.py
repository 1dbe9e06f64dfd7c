"""A worker that died inside a tool step: the step is taken again only if no tool was running.

The runner saves a marker before a step that may run tools, and counts each tool with effects
as it starts, keeping its return value as it returns (`broker.runs.tool_guard.ToolGuard`). Here the marker a dead worker left is written as the
runner writes it, from a real agent run stopped just before its tool step; the next attempt
(an in-process RQ worker) takes the step again when the count is zero (the run pauses for
approval and later finishes with the tool run once), and fails the run when a tool had started.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic_ai import CallToolsNode
from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolReturnPart

from broker.domain.models import Decision, RunStatus
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.pause import TOOLS, Pause
from broker.runs.pause import json_messages as _json_messages
from broker.runs.starting import enqueue_resume, start_run
from broker.runs.tool_guard import returned_field, tools_field
from tests.support.agents import Recorder, recorder_for
from tests.support.jobs import work
from tests.support.slot_agents import refund_agent

SUPPORT = "tests.support.slot_agents"


async def _messages_before_the_tool_step(recorder: Recorder) -> list[Any]:
    async with refund_agent.iter("Refund A1.", deps=recorder) as agent_run:
        node = agent_run.next_node
        while not isinstance(node, CallToolsNode):
            node = await agent_run.next(node)
        return _json_messages(agent_run.all_messages())


def _died_in_the_step(broker: Broker, recorder: Recorder, tools_started: int) -> str:
    register_agent(broker, "refund", f"{SUPPORT}:refund_agent", deps="tests.support.agents:make_recorder")  # fmt: skip
    run = start_run(broker, "refund", "Refund A1.")
    messages = asyncio.run(_messages_before_the_tool_step(recorder))
    marker = Pause(0, messages, stage=TOOLS, worker="worker-host:4242")
    broker.save_messages(run.id, marker.dump())
    broker.update_run(run.id, status=RunStatus.running)
    broker.redis.hset(broker.keys.run(run.id), tools_field(0, len(marker.messages)), tools_started)
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


def _died_after_the_approved_tool_returned(broker: Broker, kept: str | None) -> tuple[str, str]:
    """A run whose approved refund ran in round 1's step, the worker dying before the step's
    end: the marker is left, the count is back to zero and (when `kept`) its return is kept."""
    register_agent(broker, "refund", f"{SUPPORT}:refund_agent", deps="tests.support.agents:make_recorder")  # fmt: skip
    run = start_run(broker, "refund", "Refund A1.")
    work(broker)
    waiting = broker.get_run(run.id)
    assert waiting.status is RunStatus.waiting, waiting.error
    broker.decide(waiting.pending[0], Decision(outcome="approved"), decided_by="ann")
    pause = Pause.load(broker.load_messages(run.id))
    assert pause is not None
    call_id = pause.calls[0]["tool_call_id"]
    marker = Pause(1, pause.messages, calls=pause.calls, stage=TOOLS)
    broker.save_messages(run.id, marker.dump())
    step = tools_field(1, len(marker.messages))
    fields = {step: 0} if kept is None else {step: 0, returned_field(step, call_id): kept}
    broker.redis.hset(broker.keys.run(run.id), mapping=fields)
    return run.id, call_id


def test_a_tool_that_returned_before_the_worker_died_gives_back_its_kept_return_on_the_retry(
    bound: Broker, recorder: Recorder
) -> None:
    run_id, call_id = _died_after_the_approved_tool_returned(bound, kept='"refunded (kept)"')
    enqueue_resume(bound, run_id, 1)
    work(bound)
    run = bound.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    assert recorder.all() == []  # the refund was not run a second time
    saved = Pause.load(bound.load_messages(run_id))
    assert saved is not None
    returns = [
        part.content
        for message in ModelMessagesTypeAdapter.validate_python(saved.messages)
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart) and part.tool_call_id == call_id
    ]
    assert returns == ["refunded (kept)"]


def test_an_approved_tool_that_returns_keeps_its_return_and_is_no_longer_counted(
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
    counts = {k: v for k, v in fields.items() if k.startswith("tools:1:") and k.count(":") == 2}
    kept = {k: v for k, v in fields.items() if k.startswith("tools:1:") and k.count(":") > 2}
    assert list(counts.values()) == ["0"]
    assert list(kept.values()) == ['"refunded"']
    assert [c["tool"] for c in recorder.all()] == ["refund"]
