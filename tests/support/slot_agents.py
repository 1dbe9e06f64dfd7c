"""Scripted agents for the worker-slot tests (no tests here): together, held, and faulty ones.

Importable as `tests.support.slot_agents:NAME` by a separate `approval-broker worker` process. Their
model functions are async, so they run on the worker's shared event loop, as a real model
client's calls do.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal

import anyio.to_thread
from pydantic_ai import Agent, ApprovalRequired, DeferredToolRequests, RunContext
from pydantic_ai.capabilities import Hooks
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis

from broker.runs.agents import DepsContext
from tests.support.agents import Recorder, _returns

TOGETHER = 40
"""How many `slow_agent` runs must be in their first model call at once before any goes on."""

_together = asyncio.Barrier(TOGETHER)
"""On the worker's one event loop: passed only when TOGETHER model calls are in flight at once."""


def effects_key(prefix: str, run_id: str) -> str:
    return f"{prefix}test:effects:{run_id}"


def per_run(ctx: DepsContext) -> Recorder:
    """Deps factory: a recorder of the run's own tool executions."""
    return Recorder(ctx.broker.redis, effects_key(ctx.broker.keys.prefix, ctx.run_id))


async def _slow_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Waits, in its first model call, until TOGETHER runs are in theirs (a worker that ran
    them one after the other would never get there: their `run_timeout_s` would fail them);
    then calls `effect` once, then ends."""
    if not _returns(messages):
        await _together.wait()
        return ModelResponse(parts=[ToolCallPart("effect", {"what": "once"})])
    return ModelResponse(parts=[TextPart("done")])


slow_agent = Agent(FunctionModel(_slow_script), deps_type=Recorder)


@slow_agent.tool
def effect(ctx: RunContext[Recorder], what: str) -> str:
    """Records every execution, so a test counts them."""
    ctx.deps.add({"tool": "effect", "call": ctx.tool_call_id})
    return "ok"


async def _raising_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise ValueError("the model's answer made no sense")


raising_agent = Agent(FunctionModel(_raising_script))


async def _hanging_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    await asyncio.sleep(3600)
    return ModelResponse(parts=[TextPart("never")])


hanging_agent = Agent(FunctionModel(_hanging_script))


async def _blocking_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    time.sleep(120)  # synchronous: holds the worker's event loop
    return ModelResponse(parts=[TextPart("never")])


blocking_agent = Agent(FunctionModel(_blocking_script))


async def _refund_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not _returns(messages):
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1"})])
    return ModelResponse(parts=[TextPart("refunded")])


refund_agent = Agent(
    FunctionModel(_refund_script), deps_type=Recorder, output_type=[str, DeferredToolRequests]
)


@refund_agent.tool
def refund(ctx: RunContext[Recorder], order: str) -> str:
    """Needs a person's approval first; records each real execution."""
    if not ctx.tool_call_approved:
        raise ApprovalRequired()
    ctx.deps.add({"tool": "refund", "call": ctx.tool_call_id})
    return "refunded"


HOLD_S = 600.0
"""How long a held run waits where it was told to: far past its `run_timeout_s`, so the
test's SIGKILL (or the run's timeout, if the test never kills) is what ends the hold."""

Where = Literal["before", "tool", "after"]
"""Where a held run stops the first time it gets there: in its first model call (before its
tool step), inside its tool (which has had its effect), or in its model call after the tool."""


def held_key(prefix: str) -> str:
    """The list each held run pushes its id to once it is held: what the test waits on."""
    return f"{prefix}test:held"


@dataclass
class Held:
    """A held run's deps: its effects recorder and where it is to stop."""

    recorder: Recorder
    redis: Redis
    prefix: str
    run_id: str
    hold: Where

    async def stop_if_here(self, where: Where) -> None:
        """The first time the run gets to its hold (in any worker): say so, and stay there."""
        if where != self.hold:
            return
        times = await anyio.to_thread.run_sync(self.redis.incr, f"{self.prefix}test:holds:{self.run_id}")  # fmt: skip
        if times != 1:
            return  # an attempt after the worker that held it died: go on
        await anyio.to_thread.run_sync(self.redis.rpush, held_key(self.prefix), self.run_id)
        await asyncio.sleep(HOLD_S)


def held_run(ctx: DepsContext) -> Held:
    """Deps factory: `start_run(..., deps={"hold": where})`."""
    prefix = ctx.broker.keys.prefix
    recorder = Recorder(ctx.broker.redis, effects_key(prefix, ctx.run_id))
    return Held(recorder, ctx.broker.redis, prefix, ctx.run_id, ctx.data["hold"])


async def _held_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not _returns(messages):
        return ModelResponse(parts=[ToolCallPart("held_effect", {"what": "once"})])
    return ModelResponse(parts=[TextPart("done")])


async def _hold_before_a_model_call(
    ctx: RunContext[Held], request_context: ModelRequestContext
) -> ModelRequestContext:
    await ctx.deps.stop_if_here("after" if _returns(request_context.messages) else "before")
    return request_context


held_agent = Agent(
    FunctionModel(_held_script),
    deps_type=Held,
    capabilities=[Hooks(before_model_request=_hold_before_a_model_call)],
)


@held_agent.tool
async def held_effect(ctx: RunContext[Held], what: str) -> str:
    """Has its effect (recorded, so a test counts executions), then stops if told to here."""
    await anyio.to_thread.run_sync(ctx.deps.recorder.add, {"tool": "held_effect", "call": ctx.tool_call_id})  # fmt: skip
    await ctx.deps.stop_if_here("tool")
    return "ok"
