"""Counting the tools with effects that run inside a marked tool step, and keeping what they return.

The runner marks a step that may run tools before taking it (`broker.runs.agent_runner`). If the worker
dies inside the step, the next attempt must know whether a tool with effects was still running:
if none was, the step is taken again, and each tool that had already returned gives back its
stored return value instead of running a second time (a tool that asks for approval defers
before doing anything, so it counts as not started); if one was still running, the run fails,
because a tool never runs twice. `ToolGuard` is a pydantic-ai capability that keeps this count,
and the return values, in the run's hash; it never decides.

An approved call's receipt is checked here too, just before its tool would start
(`broker.receipts.checks`): the jti is spent in the same atomic step that counts the tool as
started, and a refused receipt means the tool does not run and the model is told
`REFUSED_TEXT`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import anyio.to_thread
from pydantic_ai import ApprovalRequired, CallDeferred, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolCallPart, ToolReturn
from pydantic_ai.tools import ToolDefinition
from pydantic_core import PydanticSerializationError, to_json

from broker.domain.models import Request
from broker.domain.receipts import REFUSED_TEXT, ReceiptRefused
from broker.facade import Broker
from broker.receipts.checks import RUNS_A_TOOL, ReceiptChecks

NO_EFFECT_KINDS = frozenset({"output", "external", "unapproved"})
"""Tool kinds whose calls don't run user code in a tool step (they end, defer or ask)."""


MAX_KEPT_RETURN = 1 << 20
"""Bytes of JSON above which a tool's return value is not kept (a retry then fails the run)."""


def tools_field(round_no: int, marked_messages: int) -> str:
    """The run-hash field counting the tools with effects running in the marked step."""
    return f"tools:{round_no}:{marked_messages}"


def returned_field(step_field: str, tool_call_id: str) -> str:
    """The run-hash field keeping what one call of the marked step returned."""
    return f"{step_field}:{tool_call_id}"


def _kept_json(result: Any) -> bytes | None:
    """`result` as JSON to keep for a retry, or None when it can't be given back faithfully."""
    if isinstance(result, ToolReturn):
        return None  # carries content for the model besides its value: not replayed
    try:
        raw = to_json(result)
    except (PydanticSerializationError, TypeError, ValueError):
        return None
    return raw if len(raw) <= MAX_KEPT_RETURN else None


class ToolGuard(AbstractCapability[Any]):
    """Counts, in the run's hash, each tool with effects running within a marked step.

    A tool is counted as it starts; when it returns, its return value is kept and the count
    taken back, in one transaction. A worker that dies inside a tool step leaves the marker;
    the next attempt takes the step again only if no such tool was still running, giving back
    the kept return values of those that had returned (a tool that defers, asking for approval,
    ran nothing), and fails the run otherwise, as a tool never runs twice.

    `kept` is the run's hash as the attempt read it: the return values of an earlier attempt.
    `approved` are the decided requests of the round this attempt applies: the calls among
    them that were approved or modified run only on a receipt that passes.
    """

    def __init__(
        self,
        broker: Broker,
        run_id: str,
        kept: Mapping[str, str] | None = None,
        approved: Iterable[Request] | None = None,
    ) -> None:
        self.broker = broker
        self.key = broker.keys.run(run_id)
        self.kept = kept or {}
        self.field: str | None = None
        self.approved = {
            r.tool_call_id: r
            for r in approved or ()
            if r.decision is not None and r.decision.outcome in RUNS_A_TOOL
        }
        self.checks = ReceiptChecks(broker)

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
        if request is not None and self.checks.receipts is not None:
            return await self._on_receipt(request, call, field, args, handler)
        if field is None or tool_def.kind in NO_EFFECT_KINDS:
            return await handler(args)
        kept_as = returned_field(field, call.tool_call_id)
        kept = self.kept.get(kept_as)
        if kept is not None:
            return json.loads(kept)  # it returned in an earlier attempt: never run twice
        await anyio.to_thread.run_sync(self.broker.redis.hincrby, self.key, field, 1)
        return await self._run(field, kept_as, args, handler)

    async def _on_receipt(
        self, request: Request, call: ToolCallPart, field: str | None, args: Any, handler: Any
    ) -> Any:
        """An approved call: its kept return if it already ran, else its tool only on a receipt
        spent now (in the step that counts it as started)."""
        kept_as = returned_field(field, call.tool_call_id) if field else None
        kept = self.kept.get(kept_as) if kept_as else None
        if kept is not None:
            return json.loads(kept)  # it ran on its receipt in an earlier attempt
        try:
            await anyio.to_thread.run_sync(self._spend, request, call, field)
        except ReceiptRefused as exc:
            return f"{REFUSED_TEXT} ({exc.reason}); the tool was not run."
        if field is None or kept_as is None:
            return await handler(args)
        return await self._run(field, kept_as, args, handler)

    def _spend(self, request: Request, call: ToolCallPart, field: str | None) -> None:
        self.checks.spend(
            request, tool_name=call.tool_name, args=call.args_as_dict(), run_field=field
        )

    async def _run(self, field: str, kept_as: str, args: Any, handler: Any) -> Any:
        """Run a tool counted as started in `field`; keep its return value as `kept_as`."""
        try:
            result = await handler(args)
        except (ApprovalRequired, CallDeferred):  # deferred before any effect
            await anyio.to_thread.run_sync(self.broker.redis.hincrby, self.key, field, -1)
            raise
        raw = _kept_json(result)
        if raw is not None:  # else it stays counted: a retry of this step fails the run
            await anyio.to_thread.run_sync(self._keep, field, kept_as, raw)
        return result

    def _keep(self, field: str, kept_as: str, raw: bytes) -> None:
        """Keep a return value and stop counting its tool as running, in one transaction."""
        with self.broker.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key, kept_as, raw)
            pipe.hincrby(self.key, field, -1)
            pipe.execute()
