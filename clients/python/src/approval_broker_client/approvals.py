"""`BrokerApprovals`: a pydantic-ai capability that asks people through the broker's HTTP API.

Any `Agent(..., capabilities=[BrokerApprovals(client, queue=..., live_wait_s=...)])`, running in
any process, sends each round's deferred tool calls (approvals, questions, external calls) as
broker requests, waits up to `live_wait_s` for their outcomes, and hands back
`DeferredToolResults` for what was decided. The calls still pending end the run as
`DeferredToolRequests`, each noting its request id in its metadata, so
`client.results_for(output)` resumes it later. Creates are idempotent on the agent run and the
tool call id (`Idempotency-Key`), so a retried round never asks twice. Needs the `pydantic-ai`
extra.

An approved call runs only on its receipt (`approval_broker_client.receipts`): verified with the
broker's JWKS and spent at the broker just before the tool starts; refused, the tool does not
run and the model is told the approval could not be verified. That holds for a call approved
within `live_wait_s` and for a run resumed later with `client.results_for(output)`, whose
results name each approved call's request in its `tool_call_metadata`.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import ToolDefinition

from approval_broker_client.client import AsyncRemoteBroker, RemoteBroker
from approval_broker_client.deferred import META_KEY, new_requests, request_ids
from approval_broker_client.errors import Conflict, NotFound
from approval_broker_client.models import NewRequest, Request
from approval_broker_client.receipts import REFUSED_TEXT, ReceiptRefused, verify_receipt
from approval_broker_client.results import results_for

__all__ = ["BrokerApprovals", "request_ids"]

REMOTE_META = "approval_broker"
"""Metadata key on each request: the agent's name and the pydantic-ai run id it came from."""


def idempotency_key(run_id: str, tool_call_id: str) -> str:
    """One key per (agent run, tool call): the same call asked again gets the same request."""
    return "pydantic-ai:" + hashlib.sha256(f"{run_id}\0{tool_call_id}".encode()).hexdigest()


@dataclass
class BrokerApprovals(AbstractCapability[Any]):
    """Send deferred tool calls to the broker as requests; continue live with what is decided
    within `live_wait_s`, and let the rest end the run as `DeferredToolRequests`.

    `client` is a `RemoteBroker` or an `AsyncRemoteBroker`. `queue` is the handler queue (a tool
    may name its own in the metadata it raises with; `tool_queues` per tool), `agent` names the
    agent on the requests. Put it first among deferred-call handlers (or alone), so the calls it
    leaves pending carry their request ids.
    """

    client: RemoteBroker | AsyncRemoteBroker
    _: KW_ONLY
    queue: str = "default"
    live_wait_s: float = 0.0
    agent: str | None = None
    tool_queues: dict[str, str] = field(default_factory=dict)
    verify_receipts: bool = True
    _approved: dict[tuple[str, str], Request] = field(default_factory=dict, init=False, repr=False)
    _jwks: dict[str, Any] | None = field(default=None, init=False, repr=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[AsyncRemoteBroker]:
        """An async client on this event loop (a sync client's settings, used for this round)."""
        if isinstance(self.client, AsyncRemoteBroker):
            yield self.client
            return
        async with AsyncRemoteBroker(
            self.client.base_url, self.client.token, timeout=self.client.timeout
        ) as client:
            yield client

    def _news(self, ctx: RunContext[Any], requests: DeferredToolRequests) -> list[NewRequest]:
        origin = {"agent": self.agent, "run_id": ctx.run_id}
        news = new_requests(requests, ctx.messages, queue=self.queue, tool_queues=self.tool_queues)
        return [
            new.model_copy(update={"metadata": {**new.metadata, REMOTE_META: origin}})
            for new in news
        ]

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        news = self._news(ctx, requests)
        run_id = ctx.run_id or ""
        async with self._session() as client:
            created: list[Request] = await asyncio.gather(
                *(
                    client.create_request(
                        new, idempotency_key=idempotency_key(run_id, str(new.tool_call_id))
                    )
                    for new in news
                )
            )
            for request in created:
                call_id = request.tool_call_id
                requests.metadata[call_id] = {
                    **requests.metadata.get(call_id, {}),
                    META_KEY: request.id,
                }
            got = created
            if self.live_wait_s > 0 and any(r.is_pending for r in created):
                got = await client.wait_for([r.id for r in created], self.live_wait_s)
        decided = [r for r in got if not r.is_pending]
        for request in decided:
            if request.kind == "approval" and str(request.status) in ("approved", "modified"):
                self._approved[(run_id, request.tool_call_id)] = request
        return results_for(decided) if decided else None

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: Any,
    ) -> Any:
        request = self._approved.pop((ctx.run_id or "", call.tool_call_id), None)
        if not self.verify_receipts:
            return await handler(args)
        if request is None:  # resumed later with `results_for`: its metadata names the request
            metadata = ctx.tool_call_metadata
            request_id = metadata.get(META_KEY) if isinstance(metadata, dict) else None
            if not isinstance(request_id, str):
                return await handler(args)
            async with self._session() as client:
                request = await client.get_request(request_id)
        try:
            await self._check_receipt(request, call)
        except ReceiptRefused as exc:
            return f"{REFUSED_TEXT} ({exc.reason}); the tool was not run."
        return await handler(args)

    async def _check_receipt(self, request: Request, call: ToolCallPart) -> None:
        """Verify `request`'s receipt for `call` with the JWKS, then spend it at the broker."""
        async with self._session() as client:
            if self._jwks is None:
                try:
                    self._jwks = await client.jwks()
                except NotFound:  # this broker signs no receipts: nothing to check
                    return
            token = request.decision.receipt if request.decision is not None else None
            args = call.args_as_dict()
            verify_receipt(
                self._jwks, token, request_id=request.id, tool_name=call.tool_name, args=args
            )
            try:
                await client.spend_receipt(request.id, call.tool_name, args)
            except Conflict as exc:
                if exc.code != "receipt_refused":
                    raise
                reason = exc.detail.split(":", 1)[0]
                raise ReceiptRefused(reason, exc.detail) from None
