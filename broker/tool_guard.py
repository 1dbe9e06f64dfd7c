"""Counting the tools with effects that start inside a marked tool step of a run.

The runner marks a step that may run tools before taking it (`broker.runner`). If the worker
dies inside the step, the next attempt must know whether any tool with effects had started:
if none had (a tool that asks for approval defers before doing anything), the step is taken
again; if one had, the run fails, because a tool never runs twice. `ToolGuard` is a pydantic-ai
capability that counts each such tool in the run's hash as it starts; it never decides.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from pydantic_ai import ApprovalRequired, CallDeferred, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import ToolDefinition

from broker.client import Broker

NO_EFFECT_KINDS = frozenset({"output", "external", "unapproved"})
"""Tool kinds whose calls don't run user code in a tool step (they end, defer or ask)."""


def tools_field(round_no: int, marked_messages: int) -> str:
    """The run-hash field counting the tools with effects started in the marked step."""
    return f"tools:{round_no}:{marked_messages}"


class ToolGuard(AbstractCapability[Any]):
    """Counts, in the run's hash, each tool with effects as it starts within a marked step.

    A worker that dies inside a tool step leaves the marker; the next attempt takes the step
    again only if no such tool had started (a tool that defers, asking for approval, ran
    nothing), and fails the run otherwise, as a tool never runs twice.
    """

    def __init__(self, broker: Broker, run_id: str) -> None:
        self.broker = broker
        self.key = broker.keys.run(run_id)
        self.field: str | None = None

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: Any,
    ) -> Any:
        field = self.field
        if field is None or tool_def.kind in NO_EFFECT_KINDS:
            return await handler(args)
        await anyio.to_thread.run_sync(self.broker.redis.hincrby, self.key, field, 1)
        try:
            return await handler(args)
        except (ApprovalRequired, CallDeferred):  # deferred before any effect
            await anyio.to_thread.run_sync(self.broker.redis.hincrby, self.key, field, -1)
            raise
