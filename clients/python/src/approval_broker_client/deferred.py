"""From a stopped run's `DeferredToolRequests` to broker requests, and back to their ids.

What a tool may set in the metadata it raises with (`prompt`, `queue`, `timeout_s`,
`allowed_roles`) is read as the fleet reads it: a bad timeout or prompt is ignored with a
warning, while `allowed_roles` that names no role raises `BadCallMetadata`, because ignoring
it would let every approver decide. Needs the `pydantic-ai` extra.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_core import to_jsonable_python

from approval_broker_client.models import NewRequest

log = logging.getLogger("approval_broker_client")

META_KEY = "approval_broker_request_id"
"""Where `BrokerApprovals` notes, in a deferred call's metadata, the request it became."""
MAX_TIMEOUT_S = 365 * 86400
MAX_PROMPT = 20_000


class BadCallMetadata(ValueError):
    """A tool asked for routing that can't be honoured safely."""


def request_ids(deferred: DeferredToolRequests) -> list[str]:
    """The broker request of each call of a stopped run, as `BrokerApprovals` noted them."""
    ids = []
    for call in [*deferred.approvals, *deferred.calls]:
        rid = (deferred.metadata.get(call.tool_call_id) or {}).get(META_KEY)
        if not isinstance(rid, str):
            raise ValueError(
                f"deferred call {call.tool_call_id} carries no broker request id; were these "
                "DeferredToolRequests made by a run with BrokerApprovals?"
            )
        ids.append(rid)
    return ids


def _order(messages: Sequence[ModelMessage]) -> dict[str, int]:
    order: dict[str, int] = {}
    for message in messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    order.setdefault(part.tool_call_id, len(order))
    return order


def _args(call: ToolCallPart) -> dict[str, Any]:
    try:
        return to_jsonable_python(call.args_as_dict(), fallback=str)
    except ValueError:
        return {"_raw": str(call.args)}


def _timeout(call: ToolCallPart, value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_TIMEOUT_S
    ):
        return float(value)
    log.warning("tool %s: ignoring timeout_s=%r; the queue's applies", call.tool_name, value)
    return None


def _roles(call: ToolCallPart, value: Any) -> list[str]:
    if value is None:
        return []
    roles = (
        [r for r in value if isinstance(r, str) and r] if isinstance(value, list | tuple) else []
    )
    if not roles and value:
        raise BadCallMetadata(
            f"tool {call.tool_name!r} gives allowed_roles={value!r}, which names no role; "
            "it must be a list of role names"
        )
    return roles


def new_requests(
    output: DeferredToolRequests,
    messages: Sequence[ModelMessage],
    *,
    queue: str,
    tool_queues: Mapping[str, str],
) -> list[NewRequest]:
    """One request per pending call, in the model's order: approvals are `approval`, calls
    `question` or `external`; the call's metadata goes to the request."""
    order = _order(messages)
    calls = sorted(
        [*output.approvals, *output.calls], key=lambda c: order.get(c.tool_call_id, len(order))
    )
    out = []
    for call in calls:
        raw = output.metadata.get(call.tool_call_id)
        meta = to_jsonable_python(raw, fallback=str) if raw is not None else {}
        meta = meta if isinstance(meta, dict) else {"value": meta}
        prompt, own_queue = meta.get("prompt"), meta.get("queue")
        out.append(
            NewRequest(
                tool_name=call.tool_name,
                tool_call_id=call.tool_call_id,
                args=_args(call),
                kind=output.kind(call.tool_call_id),
                prompt=prompt[:MAX_PROMPT] if isinstance(prompt, str) and prompt else None,
                metadata=meta,
                queue=own_queue
                if isinstance(own_queue, str) and own_queue
                else tool_queues.get(call.tool_name, queue),
                timeout_s=_timeout(call, meta.get("timeout_s")),
                allowed_roles=_roles(call, meta.get("allowed_roles")),
            )
        )
    return out
