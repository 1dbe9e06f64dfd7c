"""Scripted agents and helpers for the worker tests (no tests here).

The agents are importable as `tests.support.agents:NAME`, so a forked or separate worker
process loads them the same way a fleet worker loads a user's agent. What their tools do is
recorded in Redis, so a test sees it whichever process ran the tool.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic_ai import Agent, ApprovalRequired, CallDeferred, DeferredToolRequests, RunContext
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis

from broker.runs.agents import DepsContext

SECRET = "METADATA-ONLY-7f3a"


@dataclass
class Recorder:
    """Tool executions, in Redis under the broker's prefix."""

    redis: Redis
    key: str

    def add(self, what: dict[str, Any]) -> None:
        self.redis.rpush(self.key, json.dumps(what))

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.redis.lrange(self.key, 0, -1)]


def recorder_for(redis: Redis, prefix: str) -> Recorder:
    return Recorder(redis, f"{prefix}test:tool-calls")


def make_recorder(ctx: DepsContext) -> Recorder:
    return recorder_for(ctx.broker.redis, ctx.broker.keys.prefix)


def model_visible(messages: list[ModelMessage]) -> str:
    """Everything a model is sent: prompts, instructions, tool results and its own tool calls."""
    chunks: list[str] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            chunks.append(str(message.instructions or ""))
            chunks += [str(getattr(p, "content", "")) for p in message.parts]
        else:
            chunks += [str(getattr(p, "args", "") or getattr(p, "content", "")) for p in message.parts]  # fmt: skip
    return "\n".join(chunks)


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def _final(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


# ---- a question -----------------------------------------------------------------------------


def _ask_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = _returns(messages)
    if not returns:
        return ModelResponse(parts=[ToolCallPart("ask_customer", {"question": "Which colour?"})])
    seen = SECRET in model_visible(messages)
    r = returns[-1]
    return _final(f"{r.outcome}: {r.content} (secret seen: {seen})")


ask_agent = Agent(FunctionModel(_ask_script), output_type=[str, DeferredToolRequests])


@ask_agent.tool_plain
def ask_customer(question: str) -> str:
    """Ask the customer something; a person answers for them."""
    raise CallDeferred(metadata={"prompt": f"Customer asks: {question}", "secret": SECRET}, kind="question")  # fmt: skip


# ---- two approvals in one response ------------------------------------------------------------


def _pair_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returns = _returns(messages)
    if not returns:
        return ModelResponse(
            parts=[
                ToolCallPart("send_email", {"to": "ann@example.com"}),
                ToolCallPart("charge_card", {"amount": 30}),
            ]
        )
    return _final("; ".join(f"{r.tool_name}={r.outcome}:{r.content}" for r in returns))


pair_agent = Agent(
    FunctionModel(_pair_script), deps_type=Recorder, output_type=[str, DeferredToolRequests]
)


@pair_agent.tool
def send_email(ctx: RunContext[Recorder], to: str) -> str:
    if not ctx.tool_call_approved:
        raise ApprovalRequired(metadata={"queue": "managers"})
    ctx.deps.add({"tool": "send_email", "to": to, "by": ctx.tool_call_metadata})
    return f"sent to {to}"


@pair_agent.tool
def charge_card(ctx: RunContext[Recorder], amount: int) -> str:
    if not ctx.tool_call_approved:
        raise ApprovalRequired()
    ctx.deps.add({"tool": "charge_card", "amount": amount})
    return f"charged {amount}"


# ---- an agent that never stops asking -------------------------------------------------------------


def _loop_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("one_more", {"n": len(_returns(messages)) + 1})])


loop_agent = Agent(FunctionModel(_loop_script), output_type=[str, DeferredToolRequests])


@loop_agent.tool
def one_more(ctx: RunContext[None], n: int) -> str:
    if not ctx.tool_call_approved:
        raise ApprovalRequired()
    return f"step {n} done"


# ---- a model that fails once, as a provider does under load ------------------------------------

FLAKY = {"failures_left": 0}


def _flaky_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if FLAKY["failures_left"] > 0:
        FLAKY["failures_left"] -= 1
        raise ModelHTTPError(503, "flaky-model", {"error": "overloaded"})
    return _final("made it")


flaky_agent = Agent(FunctionModel(_flaky_script))


def _broken_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise ValueError("the model adapter is broken")


broken_agent = Agent(FunctionModel(_broken_script))


# ---- tools with effects, and a model that fails once after they ran ------------------------------

FAIL_AFTER = {"note": 0, "pay": 0}
"""How many times the model raises a 503 right after `note` (or `pay`) returned."""


def _effects_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = {r.tool_name: r for r in _returns(messages)}
    if "note" not in done:
        return ModelResponse(parts=[ToolCallPart("note", {"text": "customer called"})])
    if "pay" not in done:
        if FAIL_AFTER["note"] > 0:
            FAIL_AFTER["note"] -= 1
            raise ModelHTTPError(503, "effects-model", {"error": "overloaded"})
        return ModelResponse(parts=[ToolCallPart("pay", {"amount": 5})])
    if FAIL_AFTER["pay"] > 0:
        FAIL_AFTER["pay"] -= 1
        raise ModelHTTPError(503, "effects-model", {"error": "overloaded"})
    return _final(f"note={done['note'].content}; pay={done['pay'].outcome}:{done['pay'].content}")


effects_agent = Agent(
    FunctionModel(_effects_script), deps_type=Recorder, output_type=[str, DeferredToolRequests]
)


@effects_agent.tool
def note(ctx: RunContext[Recorder], text: str) -> str:
    """Needs no approval: runs as soon as the model asks."""
    ctx.deps.add({"tool": "note", "call": ctx.tool_call_id})
    return "noted"


@effects_agent.tool
def pay(ctx: RunContext[Recorder], amount: int) -> str:
    """Needs a person's approval first."""
    if not ctx.tool_call_approved:
        raise ApprovalRequired()
    ctx.deps.add({"tool": "pay", "call": ctx.tool_call_id})
    return f"paid {amount}"


# ---- a tool that loses its network after it had its effect -----------------------------------


def _drop_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not _returns(messages):
        return ModelResponse(parts=[ToolCallPart("send", {"to": "ann"})])
    return _final("sent")


drop_agent = Agent(FunctionModel(_drop_script), deps_type=Recorder)


@drop_agent.tool
def send(ctx: RunContext[Recorder], to: str) -> str:
    ctx.deps.add({"tool": "send", "to": to})
    raise httpx.ConnectError("connection reset while reading the reply")


# ---- work horses that die: SIGKILL, as the OOM killer sends it ----------------------------------

TEST_PROCESS = os.getpid()
"""The process that imported this module first; it dies only if it is a worker a test started."""
MAY_DIE = "APPROVAL_BROKER_TEST_WORKER_MAY_DIE"
"""Set (to 1) in the environment of a worker process that a test lets die."""


def die_if_forked() -> None:
    if os.getpid() == TEST_PROCESS and os.environ.get(MAY_DIE) != "1":
        raise RuntimeError("refusing to SIGKILL the test process itself")
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    die_if_forked()
    raise AssertionError("unreachable")


killed_agent = Agent(FunctionModel(_kill_script), output_type=[str, DeferredToolRequests])


def _dying_tool_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if not _returns(messages):
        return ModelResponse(parts=[ToolCallPart("ship", {"order": "A1"})])
    return _final("shipped")


dying_tool_agent = Agent(FunctionModel(_dying_tool_script), deps_type=Recorder)


@dying_tool_agent.tool
def ship(ctx: RunContext[Recorder], order: str) -> str:
    """Has its effect, then the horse is killed before the result is saved."""
    ctx.deps.add({"tool": "ship", "order": order})
    die_if_forked()
    return "shipped"


# ---- an agent that can't pause: output validators, and no DeferredToolRequests -------------------

validated_agent = Agent(FunctionModel(_ask_script))


@validated_agent.output_validator
def _non_empty(output: str) -> str:
    return output


@validated_agent.tool_plain
def ask_validated(question: str) -> str:
    raise CallDeferred(kind="question")
