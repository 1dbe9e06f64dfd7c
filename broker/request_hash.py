"""How a request is stored: its Redis hash written from a `NewRequest`, and read back.

Structured fields are JSON text; times are epoch seconds with six decimals, set by the Lua
step on Redis's clock (`created_at`, `expires_at`), so this module writes neither.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic_core import to_json

from broker.models import (
    HistoryEntry,
    NewRequest,
    Request,
    Status,
    args_hash,
    canonical_json,
    from_timestamp,
)
from broker.text import as_str_dict

JSON_FIELDS = (
    "args",
    "data",
    "metadata",
    "allowed_roles",
    "decision",
    "history",
    "suggested_rules",
    "args_schema",
)
INTERNAL_FIELDS = ("deadlines",)  # kept by the Lua steps, not part of `Request`


def default_prompt(tool_name: str, args: dict[str, Any]) -> str:
    """A readable sentence from a tool call: `refund(order_id='A1', amount=120)`."""
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"The agent wants to call {tool_name}({shown})"


def request_fields(
    new: NewRequest,
    request_id: str,
    run_id: str | None,
    round_no: int,
    suggested_rules: list[dict[str, Any]] | None = None,
) -> dict[str, str]:
    """The hash of a new pending request, all but its id and times (and `args_schema` only
    when there is one)."""
    fields = {
        "run_id": run_id or "",
        "round": str(round_no),
        "tool_call_id": new.tool_call_id or request_id,
        "tool_name": new.tool_name,
        "args": canonical_json(new.args),
        "args_hash": args_hash(new.args),
        "kind": new.kind,
        "prompt": new.prompt or default_prompt(new.tool_name, new.args),
        "data": _json(new.data),
        "metadata": _json(new.metadata),
        "queue": new.queue,
        "allowed_roles": _json(new.allowed_roles),
        "callback": new.callback or "",
        "status": Status.pending.value,
        "history": "[]",
    }
    if suggested_rules:
        fields["suggested_rules"] = _json(suggested_rules)
    if new.args_schema is not None:
        fields["args_schema"] = canonical_json(new.args_schema)
    return fields


def parse_request(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> Request:
    """A request from its hash (HGETALL, or the field list a Lua step replies with)."""
    f: dict[str, Any] = as_str_dict(raw)
    for name in JSON_FIELDS:
        if f.get(name):
            f[name] = json.loads(f[name])
        else:
            f.pop(name, None)
    for name in INTERNAL_FIELDS:
        f.pop(name, None)
    f["run_id"] = f.get("run_id") or None
    f["callback"] = f.get("callback") or None
    f["created_at"] = from_timestamp(float(f["created_at"]))
    f["expires_at"] = from_timestamp(float(f["expires_at"]))
    return Request.model_validate(f)


def parse_flat(flat: list[str]) -> Request:
    """A request from a flat field, value, field, value... list (a Lua step's HGETALL)."""
    return parse_request(dict(zip(flat[::2], flat[1::2], strict=True)))


def history_json(entry: HistoryEntry) -> str:
    return entry.model_dump_json(exclude_none=True)


def _json(value: Any) -> str:
    return to_json(value).decode()
