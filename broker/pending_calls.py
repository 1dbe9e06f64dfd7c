"""From a paused run's `DeferredToolRequests` to the broker requests a person will see."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai import DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_core import to_jsonable_python

from broker.config import AgentConfig
from broker.models import NewRequest


def _call_order(messages: Sequence[ModelMessage]) -> dict[str, int]:
    """Where each tool call appears in the history, so requests follow the model's order."""
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


def _metadata(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    value = to_jsonable_python(raw, fallback=str)
    return value if isinstance(value, dict) else {"value": value}


def new_requests(
    output: DeferredToolRequests, spec: AgentConfig, messages: Sequence[ModelMessage] = ()
) -> list[NewRequest]:
    """One request per pending call: approvals are `approval`, calls `question` or `external`.

    The call's metadata goes to the request (for the app and frontend, never the model); a tool
    may set `prompt`, `queue`, `timeout_s` and `allowed_roles` there. Otherwise the queue is the
    agent's (per tool where `tool_queues` names it) and the prompt is built from name and args.
    """
    order = _call_order(messages)
    calls = sorted(
        [*output.approvals, *output.calls], key=lambda c: order.get(c.tool_call_id, len(order))
    )
    out: list[NewRequest] = []
    for call in calls:
        meta = _metadata(output.metadata.get(call.tool_call_id))
        prompt = meta.get("prompt")
        queue = meta.get("queue")
        timeout_s = meta.get("timeout_s")
        roles = meta.get("allowed_roles")
        out.append(
            NewRequest(
                tool_name=call.tool_name,
                tool_call_id=call.tool_call_id,
                args=_args(call),
                kind=output.kind(call.tool_call_id),
                prompt=prompt if isinstance(prompt, str) and prompt else None,
                metadata=meta,
                queue=queue
                if isinstance(queue, str) and queue
                else spec.tool_queues.get(call.tool_name, spec.queue),
                timeout_s=timeout_s if isinstance(timeout_s, int | float) else None,
                allowed_roles=[r for r in roles if isinstance(r, str)]
                if isinstance(roles, list)
                else [],
            )
        )
    return out
