"""Counting the tools with effects that start inside a marked tool step.

The runner marks a step that may run tools (`broker.runs.agent_runner`). If the worker dies
inside the step, the next attempt must know whether a tool with effects had started: if none
had, the step is taken again; if one had, the run fails, because a tool never runs twice.
`ToolGuard` is a pydantic-ai capability that keeps this count in the run's hash; it never
decides.

The marker itself (the run's stage TOOLS, `broker.runs.pause`) is written by the first tool
with effects that starts, in the same MULTI that counts it (`broker.runs.agent_runner_writes`):
one round trip before a tool runs, and none for a step whose tools have no effects. A tool's
return needs no write of its own: the checkpoint after the step (stage CONTINUE) holds it, and
a tool that defers (asks for approval) needs none either, as the pause that follows (stage
WAITING) supersedes the marker.

An approved call's receipt is checked here too, just before its tool would start
(`broker.receipts.checks`): the jti is spent in the same atomic step that counts the tool as
started (and writes the marker), and a refused receipt means the tool does not run and the
model is told `REFUSED_TEXT`.

A run marked by a version that kept each tool's return value in the run's hash
(`returned_field`) gives those back when its step is taken again, as that version did.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ToolCallPart
from pydantic_ai.tools import ToolDefinition

from broker.domain.models import Request
from broker.domain.receipts import REFUSED_TEXT, ReceiptRefused
from broker.facade import Broker
from broker.receipts.checks import RUNS_A_TOOL, ReceiptChecks
from broker.runs.agent_runner_writes import Extra, RoundWrites
from broker.runs.pause import Pause

NO_EFFECT_KINDS = frozenset({"output", "external", "unapproved"})
"""Tool kinds whose calls don't run user code in a tool step (they end, defer or ask)."""


def tools_field(round_no: int, marked_messages: int) -> str:
    """The run-hash field counting the tools with effects started in the marked step."""
    return f"tools:{round_no}:{marked_messages}"


def returned_field(step_field: str, tool_call_id: str) -> str:
    """The run-hash field where an earlier version kept what one call of the step returned."""
    return f"{step_field}:{tool_call_id}"


class ToolGuard(AbstractCapability[Any]):
    """Counts, in the run's hash, each tool with effects that starts within a marked step.

    `writes` are the attempt's writes (the first count carries the step's marker); `kept` is
    the run's hash as the attempt read it; `approved` are the decided requests of the round
    this attempt applies: the calls among them that were approved or modified run only on a
    receipt that passes.
    """

    def __init__(
        self,
        broker: Broker,
        writes: RoundWrites,
        kept: Mapping[str, str] | None = None,
        approved: Iterable[Request] | None = None,
    ) -> None:
        self.broker = broker
        self.writes = writes
        self.key = broker.keys.run(writes.run_id)
        self.kept = kept or {}
        self.field: str | None = None
        self._marker: tuple[Pause, list[ModelMessage]] | None = None
        self._marked: asyncio.Future[list[Any]] | None = None
        self.approved = {
            r.tool_call_id: r
            for r in approved or ()
            if r.decision is not None and r.decision.outcome in RUNS_A_TOOL
        }
        self.checks = ReceiptChecks(broker)

    def arm(self, field: str, marker: Pause, messages: list[ModelMessage]) -> None:
        """A step that may run tools is next: count its tools in `field`; the first that
        starts writes `marker` (standing at `messages`)."""
        self.field = field
        self._marker = (marker, messages)
        self._marked = None

    def disarm(self) -> None:
        """The step is over (a step none of whose tools had effects wrote nothing)."""
        self._marker = None

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
        request = self.approved.get(call.tool_call_id)
        receipted = request is not None and self.checks.receipts is not None
        if not receipted and (field is None or tool_def.kind in NO_EFFECT_KINDS):
            return await handler(args)
        kept = self.kept.get(returned_field(field, call.tool_call_id)) if field else None
        if kept is not None:
            return json.loads(kept)  # it returned in an earlier attempt: never run twice
        if not receipted:
            await self._start(field, extra=lambda p: p.hincrby(self.key, field, 1))
            return await handler(args)
        assert request is not None

        tool_name, call_args = call.tool_name, call.args_as_dict()

        def spend() -> Extra:
            claims = self.checks.check(request, tool_name=tool_name, args=call_args)
            return lambda pipe: self.checks.queue_spend(pipe, request, claims, run_field=field)

        try:
            if self.writes.on_loop:  # checked on the loop, spent in the marker's asyncio MULTI
                claims = await self.checks.acheck(request, tool_name=tool_name, args=call_args)
                replies = await self._start(
                    field,
                    extra=lambda pipe: self.checks.queue_spend(
                        pipe, request, claims, run_field=field
                    ),
                )
            else:
                replies = await self._start(field, prepare=spend)
            self.checks.spent(request, replies[-1])
        except ReceiptRefused as exc:
            return f"{REFUSED_TEXT} ({exc.reason}); the tool was not run."
        return await handler(args)

    async def _start(
        self,
        field: str | None,
        *,
        extra: Extra | None = None,
        prepare: Callable[[], Extra] | None = None,
    ) -> list[Any]:
        """Count a tool as started (`extra`'s commands; or `prepare` gives them, in the write's
        thread: a receipt's check and spend), with the step's marker if it is the first: one
        MULTI, before the tool runs. Parallel tools: the first writes the marker; the others
        write after it."""
        if field is not None and self._marker is not None:
            pause, messages = self._marker
            self._marker = None
            self._marked = asyncio.ensure_future(
                self.writes.step(pause, messages, extra=extra, prepare=prepare)
            )
            return await self._marked
        if self._marked is not None:
            await self._marked
        return await self.writes.step(None, extra=extra, prepare=prepare)
