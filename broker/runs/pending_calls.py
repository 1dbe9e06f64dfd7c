"""From a paused run's `DeferredToolRequests` to the broker requests a person will see."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_core import to_jsonable_python

from broker.domain.args_schema import check_schema
from broker.domain.config_sections import AgentConfig
from broker.domain.errors import InvalidInput
from broker.domain.models import NewRequest

log = logging.getLogger("broker.runs.pending_calls")

MAX_TIMEOUT_S = 365 * 86400
MAX_PROMPT = 20_000


class BadCallMetadata(ValueError):
    """A tool asked for routing that can't be honoured safely; the run fails with this message."""


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


def _timeout(call: ToolCallPart, value: Any) -> float | None:
    """A positive number of seconds (up to a year), else None: the queue's timeout applies."""
    if value is None:
        return None
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_TIMEOUT_S
    ):
        return float(value)
    log.warning(
        "tool %s (call %s): ignoring timeout_s=%r (needs a number of seconds > 0 and <= %s); "
        "the queue's timeout applies",
        call.tool_name,
        call.tool_call_id,
        value,
        MAX_TIMEOUT_S,
    )
    return None


def _roles(call: ToolCallPart, value: Any) -> list[str]:
    """Role names; entries that are not non-empty strings are dropped with a warning.

    A value that leaves no role at all although some were asked for (a bare string, a number,
    a list of numbers) would open the request to every approver, so it fails the run instead.
    """
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise BadCallMetadata(
            f"tool {call.tool_name!r} gives allowed_roles={value!r}; it must be a list of role "
            "names (an empty list lets any approver decide)"
        )
    roles = [r for r in value if isinstance(r, str) and r]
    if len(roles) != len(value):
        log.warning(
            "tool %s (call %s): ignoring allowed_roles entries that are not role names: %r",
            call.tool_name,
            call.tool_call_id,
            [r for r in value if not (isinstance(r, str) and r)],
        )
        if not roles:
            raise BadCallMetadata(
                f"tool {call.tool_name!r} gives allowed_roles={value!r}, which names no role; "
                "it must be a list of role names"
            )
    return roles


def _queue(
    call: ToolCallPart, value: Any, spec: AgentConfig, queues: Collection[str] | None
) -> str:
    """The call's own queue if it names one, else the agent's (per tool where configured)."""
    fallback = spec.tool_queues.get(call.tool_name, spec.queue)
    if value is None:
        return fallback
    if not isinstance(value, str) or not value:
        log.warning(
            "tool %s (call %s): ignoring queue=%r (not a queue name); using %r",
            call.tool_name,
            call.tool_call_id,
            value,
            fallback,
        )
        return fallback
    if queues is not None and value not in queues:
        known = ", ".join(sorted(queues))
        raise BadCallMetadata(
            f"tool {call.tool_name!r} routes its request to queue {value!r}, which is not "
            f"defined (known: {known})"
        )
    return value


def tool_schemas(agent: Agent[Any, Any]) -> dict[str, dict[str, Any]]:
    """Each tool's argument schema (pydantic-ai's `parameters_json_schema`), by tool name.

    From the agent's toolsets as built: function tools (`.tools`) and external ones
    (`.tool_defs`), looking through wrappers (`.wrapped`) and combinations (`.toolsets`). A
    toolset whose tools are only known during a run (an MCP server) gives none: its requests
    carry no schema, and their `modified` args are not checked.
    """
    found: dict[str, dict[str, Any]] = {}
    todo: list[Any] = list(agent.toolsets)
    seen: set[int] = set()
    while todo:
        toolset = todo.pop()
        if id(toolset) in seen:
            continue
        seen.add(id(toolset))
        for tool in (getattr(toolset, "tools", None) or {}).values():
            tool_def = getattr(tool, "tool_def", None)
            if tool_def is not None:
                found.setdefault(tool_def.name, tool_def.parameters_json_schema)
        for tool_def in getattr(toolset, "tool_defs", None) or ():
            found.setdefault(tool_def.name, tool_def.parameters_json_schema)
        wrapped = getattr(toolset, "wrapped", None)
        if wrapped is not None:
            todo.append(wrapped)
        todo.extend(getattr(toolset, "toolsets", None) or ())
    return found


def _schema(call: ToolCallPart, schemas: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The call's tool schema, as JSON; one the broker can't use is left out with a warning."""
    schema = schemas.get(call.tool_name)
    if schema is None:
        return None
    value = to_jsonable_python(schema, fallback=str)
    try:
        check_schema(value)
    except InvalidInput as exc:
        log.warning("tool %s: its args schema is not kept: %s", call.tool_name, exc.detail)
        return None
    return value


def new_requests(
    output: DeferredToolRequests,
    spec: AgentConfig,
    messages: Sequence[ModelMessage] = (),
    *,
    queues: Collection[str] | None = None,
    schemas: Mapping[str, dict[str, Any]] | None = None,
) -> list[NewRequest]:
    """One request per pending call: approvals are `approval`, calls `question` or `external`.

    The call's metadata goes to the request (for the app and frontend, never the model); a tool
    may set `prompt`, `queue`, `timeout_s` and `allowed_roles` there. Otherwise the queue is the
    agent's (per tool where `tool_queues` names it) and the prompt is built from name and args.

    Bad values are checked here rather than left to fail later with a validation error:

    * `timeout_s` that is not a number of seconds in (0, one year] (booleans included) is ignored
      with a logged warning, so the queue's timeout applies;
    * `prompt` or `queue` that is not a non-empty string is ignored (a warning for `queue`), and
      a prompt is cut at 20,000 characters;
    * `allowed_roles` entries that are not role names are dropped with a warning; but a value
      that is not a list, or that names no role at all, raises `BadCallMetadata`, because
      ignoring it would let every approver decide;
    * a `queue` that `queues` (the configured handler queues) doesn't define raises
      `BadCallMetadata`: sending the request somewhere else could show it to the wrong people,
      so the run fails with a message naming the queue instead.

    `schemas` (tool name -> args JSON Schema, see `tool_schemas`) gives each request its tool's
    `args_schema`, which `modified` args must then meet.
    """
    order = _call_order(messages)
    calls = sorted(
        [*output.approvals, *output.calls], key=lambda c: order.get(c.tool_call_id, len(order))
    )
    out: list[NewRequest] = []
    for call in calls:
        meta = _metadata(output.metadata.get(call.tool_call_id))
        prompt = meta.get("prompt")
        out.append(
            NewRequest(
                tool_name=call.tool_name,
                tool_call_id=call.tool_call_id,
                args=_args(call),
                kind=output.kind(call.tool_call_id),
                prompt=prompt[:MAX_PROMPT] if isinstance(prompt, str) and prompt else None,
                metadata=meta,
                queue=_queue(call, meta.get("queue"), spec, queues),
                timeout_s=_timeout(call, meta.get("timeout_s")),
                allowed_roles=_roles(call, meta.get("allowed_roles")),
                args_schema=_schema(call, schemas or {}),
            )
        )
    return out
