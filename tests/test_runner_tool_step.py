"""A worker that died inside a tool step: the step is taken again only if no tool had started.

The runner saves a marker before a step that may run tools, and counts each tool with effects
as it starts (`broker.runner.ToolGuard`). Here the marker a dead worker left is written as the
runner writes it, from a real agent run stopped just before its tool step; the next attempt
(an in-process RQ worker) takes the step again when the count is zero (the run pauses for
approval and later finishes with the tool run once), and fails the run when a tool had started.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic_ai import CallToolsNode

from broker.agents import register_agent
from broker.client import Broker
from broker.models import Decision, RunStatus
from broker.runner import TOOLS, Pause, _json_messages
from broker.runs import start_run
from broker.tool_guard import tools_field
from tests.conftest import work
from tests.slots_support import refund_agent
from tests.test_workers_support import Recorder, recorder_for

SUPPORT = "tests.slots_support"


async def _messages_before_the_tool_step(recorder: Recorder) -> list[Any]:
    async with refund_agent.iter("Refund A1.", deps=recorder) as agent_run:
        node = agent_run.next_node
        while not isinstance(node, CallToolsNode):
            node = await agent_run.next(node)
        return _json_messages(agent_run.all_messages())


def _died_in_the_step(broker: Broker, recorder: Recorder, tools_started: int) -> str:
    register_agent(broker, "refund", f"{SUPPORT}:refund_agent", deps="tests.test_workers_support:make_recorder")  # fmt: skip
    run = start_run(broker, "refund", "Refund A1.")
    marker = Pause(0, asyncio.run(_messages_before_the_tool_step(recorder)), stage=TOOLS)
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
    from broker.runs import enqueue_resume

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
    assert "interrupted in round 0 while its tools were running" in (run.error or "")
    assert recorder.all() == []
