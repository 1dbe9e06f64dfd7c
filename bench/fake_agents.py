"""The agents bench/bench_agents.py runs on the fleet: a refund that needs approval, fake model.

The model answers at once (`fast`) or after an asynchronous sleep per call (`slow`, as a real
provider's call waits on the network): first a call of `refund`, then, once the tool returned
(approved), a final answer. `refund` counts its executions per run in Redis, so the bench sees
whether a tool ran once. Loaded by import path (`fake_agents:fast`) by `up`'s worker, with
bench/ on PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from pydantic_ai import Agent, ApprovalRequired, DeferredToolRequests, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis

from broker.runs.agents import DepsContext


def slow_s() -> float:
    """The slow model's sleep per call: read at each call, so that a bench that sets
    BENCH_MODEL_SLEEP_S after importing this module (bench_agents' `--slow-s`) is obeyed."""
    return float(os.environ.get("BENCH_MODEL_SLEEP_S", "1.0"))


LIVE_WAIT = (
    f"live_wait_s = {float(os.environ['BENCH_LIVE_WAIT_S'])}"
    if os.environ.get("BENCH_LIVE_WAIT_S")
    else ""
)
"""The agents' `live_wait_s` when BENCH_LIVE_WAIT_S sets it; else none, so the worker's
`[workers] live_wait_s` applies, as for any agent that sets none."""

CONFIG = f"""
[queues.default]
channels = ["inbox"]

[agents.fast]
path = "fake_agents:fast"
deps = "fake_agents:deps"
{LIVE_WAIT}

[agents.slow]
path = "fake_agents:slow"
deps = "fake_agents:deps"
{LIVE_WAIT}
"""
"""The broker config that names these agents (bench/ must be on the importing path)."""


def ran_key(prefix: str, run_id: str) -> str:
    return f"{prefix}bench:tool-ran:{run_id}"


@dataclass
class Counter:
    redis: Redis
    key: str


def deps(ctx: DepsContext) -> Counter:
    return Counter(ctx.broker.redis, ran_key(ctx.broker.keys.prefix, ctx.run_id))


def _answer(messages: list[ModelMessage]) -> ModelResponse:
    returned = any(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", []))
    if not returned:
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1", "amount": 5})])
    return ModelResponse(parts=[TextPart("refunded")])


async def answer_now(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return _answer(messages)


async def answer_slowly(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    await asyncio.sleep(slow_s())
    return _answer(messages)


def _agent(model: FunctionModel) -> Agent[Counter, str | DeferredToolRequests]:
    agent: Agent[Counter, str | DeferredToolRequests] = Agent(
        model, deps_type=Counter, output_type=[str, DeferredToolRequests]
    )

    @agent.tool
    def refund(ctx: RunContext[Counter], order: str, amount: int) -> str:
        """Refund an order: needs a person's approval."""
        if not ctx.tool_call_approved:
            raise ApprovalRequired()
        ctx.deps.redis.incr(ctx.deps.key)
        return f"refunded {amount} on {order}"

    return agent


fast = _agent(FunctionModel(answer_now))
slow = _agent(FunctionModel(answer_slowly))
