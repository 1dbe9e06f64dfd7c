"""How a request is stored: its Redis hash written from a `NewRequest`, and read back.

Structured fields are JSON text; times are epoch seconds with six decimals, set by the Lua
step on Redis's clock (`created_at`, `expires_at`), so this module writes neither. A field
whose value is its default (no run, no callback, no data, no votes yet, quorum 1, a
`tool_call_id` equal to the id, a standalone approval's suggested rules) is not written: the
reader puts the default back (`parse_request`), and every Lua step reads a missing field as
its default. That is most of a pending request's memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from pydantic_core import to_json

from broker.models import (
    HistoryEntry,
    NewRequest,
    Request,
    Status,
    canonical_json,
    from_timestamp,
)
from broker.rules.matching import suggested_rules as suggest
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


_FIELDS = tuple(Request.model_fields)
_FIELD_SET = frozenset(_FIELDS)
_set = object.__setattr__


def default_prompt(tool_name: str, args: dict[str, Any]) -> str:
    """A readable sentence from a tool call: `refund(order_id='A1', amount=120)`."""
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"The agent wants to call {tool_name}({shown})"


@dataclass(frozen=True)
class Encoded:
    """One NewRequest encoded once: the hash fields every request made from it shares (not its
    id, `tool_call_id`, times or creator) and the typed values its `Request` is built from."""

    fields: tuple[str, ...]  # name, value, name, value... (HSET's order)
    values: dict[str, Any]
    texts: dict[str, str]  # the JSON text of each structured field, as stored
    named: dict[str, str] = field(default_factory=dict)  # `fields` as name -> value

    def __post_init__(self) -> None:
        self.named.update(zip(self.fields[::2], self.fields[1::2], strict=True))
        base = dict.fromkeys(_FIELDS)  # every field of a Request, in its order
        base.update(self.values)
        base.update(_FRESH_DEFAULTS)
        _set(self, "_base", base)

    def request(
        self,
        request_id: str,
        tool_call_id: str,
        created_by: str | None,
        created_at: datetime,
        expires_at: datetime,
        allowed_roles: list[str],
    ) -> Request:
        """The Request just written, without reading it back: the values were validated as a
        NewRequest, and the structured ones are fresh copies (decoded from what was stored)."""
        values = self._base.copy()  # type: ignore[attr-defined]
        texts = self.texts
        values["id"] = request_id
        values["tool_call_id"] = tool_call_id
        values["args"] = _loads(texts["args"])
        values["metadata"] = _loads(texts["metadata"]) if "metadata" in texts else {}
        values["allowed_roles"] = list(allowed_roles)
        values["created_at"] = created_at
        values["expires_at"] = expires_at
        values["history"] = []
        values["approvals"] = []
        values["created_by"] = created_by
        if "data" in texts:
            values["data"] = _loads(texts["data"])
        if "args_schema" in texts:
            values["args_schema"] = _loads(texts["args_schema"])
        values["suggested_rules"] = (
            _loads(texts["suggested_rules"]) if "suggested_rules" in texts else []
        )
        request = Request.__new__(Request)
        _set(request, "__dict__", values)
        _set(request, "__pydantic_fields_set__", set(_FIELD_SET))
        _set(request, "__pydantic_extra__", None)
        _set(request, "__pydantic_private__", None)
        return request


_FRESH_DEFAULTS = {"status": Status.pending, "decision": None, "escalations": 0}
"""The values of a new pending request no NewRequest sets (the mutable ones are made per
request in `Encoded.request`)."""


def encode(
    new: NewRequest,
    run_id: str | None,
    round_no: int,
    quorum: int,
    suggested: list[dict[str, Any]] | None,
) -> Encoded:
    """The fields of a new pending request (see the module docstring for those left out)."""
    args_text = canonical_json(new.args)
    prompt = new.prompt or default_prompt(new.tool_name, new.args)
    texts = {"args": args_text}
    flat: list[str] = [
        "tool_name",
        new.tool_name,
        "args",
        args_text,
        "args_hash",
        hashlib.sha256(args_text.encode()).hexdigest(),
        "kind",
        new.kind,
        "prompt",
        prompt,
        "queue",
        new.queue,
        "status",
        Status.pending.value,
    ]
    if run_id:
        flat += ["run_id", run_id, "round", str(round_no)]
    if new.data is not None:
        texts["data"] = _json(new.data)
    if new.metadata:
        texts["metadata"] = _json(new.metadata)
    if new.allowed_roles:
        texts["allowed_roles"] = _json(new.allowed_roles)
    if suggested:
        texts["suggested_rules"] = _json(suggested)
    if new.args_schema is not None:
        texts["args_schema"] = canonical_json(new.args_schema)
    for name, text in texts.items():
        if name != "args" and (name != "suggested_rules" or run_id):
            flat += [name, text]  # a standalone approval's suggested rules are derived when read
    if new.callback:
        flat += ["callback", new.callback]
    if quorum != 1:
        flat += ["quorum", str(quorum)]
    values = {
        "run_id": run_id,
        "round": round_no,
        "tool_name": new.tool_name,
        "args_hash": flat[5],
        "kind": new.kind,
        "prompt": prompt,
        "queue": new.queue,
        "callback": new.callback or None,
        "quorum": quorum,
    }
    return Encoded(tuple(flat), values, texts)


def built_request(
    enc: Encoded,
    request_id: str,
    tool_call_id: str,
    created_by: str | None,
    created_at: datetime,
    expires_at: datetime,
    new: NewRequest,
) -> Request:
    """The Request just written (`Encoded.request`)."""
    return enc.request(
        request_id, tool_call_id, created_by, created_at, expires_at, new.allowed_roles
    )


def decided(request: Request, verdict: Any, at: datetime) -> Request:
    """`request` as create.lua writes it when a policy rule decides it (`verdict`,
    `broker.rule_decided.RuleVerdict`) at `at`: its status, decision and one history entry."""
    return _construct(
        {
            **request.__dict__,
            "status": verdict.status,
            "decision": verdict.decision.model_copy(update={"decided_at": at}),
            "history": [verdict.entry.model_copy(update={"at": at})],
        }
    )


def _construct(values: dict[str, Any]) -> Request:
    """`Request.model_construct` for a full set of trusted values, without its per-field
    default and alias lookups (a third of a bulk create's Python time): every field must be
    given (a KeyError otherwise, never a half-built model)."""
    request = Request.__new__(Request)
    _set(request, "__dict__", {name: values[name] for name in _FIELDS})
    _set(request, "__pydantic_fields_set__", set(_FIELD_SET))
    _set(request, "__pydantic_extra__", None)
    _set(request, "__pydantic_private__", None)
    return request


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
    f["tool_call_id"] = f.get("tool_call_id") or f.get("id")
    f["created_at"] = from_timestamp(float(f["created_at"]))
    f["expires_at"] = from_timestamp(float(f["expires_at"]))
    if (
        "suggested_rules" not in f
        and f["run_id"] is None
        and f.get("kind", "approval") == "approval"
    ):
        f["suggested_rules"] = suggest(f.get("tool_name", ""), f.get("args") or {}, None, None)
    return Request.model_validate(f)


def parse_flat(flat: list[str]) -> Request:
    """A request from a flat field, value, field, value... list (a Lua step's HGETALL)."""
    return parse_request(dict(zip(flat[::2], flat[1::2], strict=True)))


def history_json(entry: HistoryEntry) -> str:
    return entry.model_dump_json(exclude_none=True)


def _json(value: Any) -> str:
    return to_json(value).decode()


def _loads(text: str) -> Any:
    """A fresh copy of stored JSON (orjson, or json for what it refuses: integers past 64 bits)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
