"""A gated tool call as a broker request, and its outcome as what the gateway may do.

The request carries the call (`tool_name`, `args`), the gateway's name as the agent (in
`metadata.approval_broker.agent`, as `BrokerApprovals` names an agent) and the upstream tool's
input schema as `args_schema`, so every channel, rule, quorum and timeout of the queue applies
and `modified` args are checked against the tool. The gateway forwards only what the broker
recorded as approved or modified; anything else is a refusal with its reason.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from approval_broker_client import AsyncRemoteBroker, NewRequest, Request, Status

REJECTED = "A person rejected this tool call."
TIMED_OUT = "No one approved this tool call in time."
LONG_POLL_S = 60.0


def is_gated(tool_name: str, gate: Sequence[str]) -> bool:
    """Whether a tool needs approval: its name matches one of the `gate` globs."""
    return any(fnmatch.fnmatchcase(tool_name, pattern) for pattern in gate)


@dataclass(frozen=True)
class Verdict:
    """What to do with a gated call: run it with `args`, or refuse it saying `reason`."""

    run: bool
    args: dict[str, Any]
    reason: str
    request: Request


def verdict(request: Request) -> Verdict:
    """The broker's recorded outcome as the gateway's verdict (only approved/modified run)."""
    decision = request.decision
    why = decision.reason if decision and decision.reason else None
    if request.status is Status.approved:
        return Verdict(True, dict(request.args), "", request)
    if request.status is Status.modified and decision is not None and decision.args is not None:
        return Verdict(True, dict(decision.args), "", request)
    if request.status is Status.timed_out:
        reason = f"{TIMED_OUT} ({why})" if why else TIMED_OUT
        return Verdict(False, {}, reason, request)
    reason = f"{REJECTED} Reason: {why}" if why else REJECTED
    return Verdict(False, {}, reason, request)


class Gate:
    """Ask the broker about gated calls of the gateway `name`, in `queue`."""

    def __init__(
        self,
        broker: AsyncRemoteBroker,
        name: str,
        *,
        queue: str,
        gate: Sequence[str],
        timeout_s: float | None = None,
    ) -> None:
        self.broker = broker
        self.name = name
        self.queue = queue
        self.gate = list(gate)
        self.timeout_s = timeout_s

    def gated(self, tool_name: str) -> bool:
        return is_gated(tool_name, self.gate)

    async def ask(
        self, tool_name: str, args: dict[str, Any], schema: dict[str, Any] | None
    ) -> Verdict:
        """Create the request and wait, one long-poll after another, until it has an outcome
        (a rule may have decided it at once; the broker's sweeper ends a forgotten one)."""
        new = NewRequest(
            tool_name=tool_name,
            args=args,
            queue=self.queue,
            timeout_s=self.timeout_s,
            metadata={"approval_broker": {"agent": self.name, "mcp_gateway": self.name}},
            args_schema=schema,
        )
        request = await self.broker.create_request(new)
        while request.is_pending:
            request = await self.broker.get_request(request.id, wait=LONG_POLL_S)
        return verdict(request)
