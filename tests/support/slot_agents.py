"""Scripted agents for the worker-slot tests (no tests here): quick, slow, and faulty ones.

Importable as `tests.support.slot_agents:NAME` by a separate `approval-broker worker` process. Their
model functions are async, so they run on the worker's shared event loop, as a real model
client's calls do.
"""

from __future__ import annotations

import asyncio
import time

from pydantic_ai import Agent, ApprovalRequired, DeferredToolRequests, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from broker.runs.agents import DepsContext
from tests.support.agents import Recorder, _returns

SLOW_S = 1.0


def effects_key(prefix: str, run_id: str) -> str:
    return f"{prefix}test:effects:{run_id}"


def per_run(ctx: DepsContext) -> Recorder:
    """Deps factory: a recorder of the run's own tool executions."""
    return Recorder(ctx.broker.redis, effects_key(ctx.broker.keys.prefix, ctx.run_id))


async def _slow_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Waits like a real model call (asynchronously), then calls `effect` once, then ends."""
    await asyncio.sleep(SLOW_S)
    if not _returns(messages):
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
