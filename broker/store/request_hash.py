"""How a request is stored: its Redis hash written from a `NewRequest`, and read back.

Structured fields are JSON text; times are epoch seconds with six decimals, set by the Lua
step on Redis's clock (`created_at`, `expires_at`), so this module writes neither. A field
whose value is its default (no run, no callback, no data, no votes yet, quorum 1, a
`tool_call_id` equal to the id, a standalone approval's suggested rules) is not written: the
reader puts the default back (`parse_request`), and every Lua step reads a missing field as
its default. That is most of a pending request's memory.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import orjson
from pydantic_core import to_json

from broker.domain.args_hash import canonical_json
from broker.domain.models import HistoryEntry, NewRequest, Request, Status, from_timestamp
from broker.domain.rules.matching import suggested_rules as suggest
from broker.redis.replies import Fields, as_hash, as_str_dict, json_loads
from broker.tracing import telemetry as tracing

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
INTERNAL_FIELDS = ("deadlines", "traceparent", "on_timeout")  # not part of `Request`: kept by
# the Lua steps, the trace the request was made in (`broker.tracing.telemetry`; only while
# tracing is on), and what the sweeper does when a routed request times out (`reject`)


_FIELDS = tuple(Request.model_fields)
_ALL_SET = set(_FIELDS)
"""The `model_fields_set` of every Request built here (all fields are set): one set shared by
all of them, as pydantic only ever adds a field's name to it (a no-op here) and copies it for
`model_copy`; one object less per request for the garbage collector to track."""
_set = object.__setattr__


def default_prompt(tool_name: str, args: dict[str, Any]) -> str:
    """A readable sentence from a tool call: `refund(order_id='A1', amount=120)`."""
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"The agent wants to call {tool_name}({shown})"


class Encoded:
    """One NewRequest encoded once: the hash fields every request made from it shares (not its
    id, `tool_call_id`, times or creator) and the typed values its `Request` is built from."""

    __slots__ = ("named", "values", "texts", "_first", "_template", "_fresh")

    def __init__(
        self,
        named: dict[str, str],
        values: dict[str, Any],
        texts: dict[str, str],
        first: dict[str, Any],
    ) -> None:
        self.named = named  # hash field -> value, in HSET's order
        self.values = values
        self.texts = texts  # the JSON text of each structured field, as stored
        self._first: dict[str, Any] | None = first  # structured values no request holds yet
        self._template: dict[str, Any] | None = None
        self._fresh: tuple[tuple[str, Callable[[], Any]], ...] = ()

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
        NewRequest, and the structured ones are its own, as read back from what was stored.
        The first request made from it takes those decoded while encoding; the next ones
        (copies of one NewRequest) copy a template decoded once."""
        template, first = self._template, self._first
        if first is not None:
            self._first = None
            values = self._values(first)
        else:
            if template is None:
                structured = self._decoded()
                template = self._template = self._values(structured)
                self._fresh = tuple((name, _copier(value)) for name, value in structured.items())
            values = template.copy()
            values["history"] = []
            values["approvals"] = []
            for name, fresh in self._fresh:
                values[name] = fresh()
        values["id"] = request_id
        values["tool_call_id"] = tool_call_id
        values["created_by"] = created_by
        values["created_at"] = created_at
        values["expires_at"] = expires_at
        values["allowed_roles"] = list(allowed_roles)
        return _installed(values)

    def _decoded(self) -> dict[str, Any]:
        """Each structured value decoded from its stored text, as `parse_request` reads it (a
        standalone approval's suggested rules derived from its args, as there), and an empty
        one for a mutable field that has none: every request made from the template gets its
        own copy of each."""
        out = {name: _loads(text) for name, text in self.texts.items()}
        v = self.values
        if "suggested_rules" not in out and v["kind"] == "approval" and v["run_id"] is None:
            out["suggested_rules"] = suggest(v["tool_name"], out["args"], None, None)
        out.setdefault("metadata", {})
        out.setdefault("suggested_rules", [])
        return out

    def _values(self, structured: dict[str, Any]) -> dict[str, Any]:
        """Every field of a Request, in its order (`_FIELDS`), but the per-request ones."""
        v = self.values
        return {
            "id": "",
            "run_id": v["run_id"],
            "round": v["round"],
            "tool_call_id": "",
            "tool_name": v["tool_name"],
            "args": structured["args"],
            "args_hash": v["args_hash"],
            "kind": v["kind"],
            "prompt": v["prompt"],
            "data": structured.get("data"),
            "metadata": structured.get("metadata", {}),
            "queue": v["queue"],
            "allowed_roles": [],
            "callback": v["callback"],
            "created_at": None,
            "expires_at": None,
            "status": Status.pending,
            "decision": None,
            "history": [],
            "suggested_rules": structured.get("suggested_rules", []),
            "escalations": 0,
            "args_schema": structured.get("args_schema"),
            "quorum": v["quorum"],
            "approvals": [],
            "created_by": None,
            "acked_by": None,
            "acked_until": None,
            "risk": v["risk"],
        }


def encode(
    new: NewRequest,
    run_id: str | None,
    round_no: int,
    quorum: int,
    agent: str | None,
    *,
    risk: str | None = None,
    on_timeout: str | None = None,
) -> Encoded:
    """The fields of a new pending request (see the module docstring for those left out);
    `risk` and `on_timeout` are what a routing rule set (`broker.domain.rules.routing`).
    An approval's suggested rules come from its args as the caller gave them on a run (and
    are stored); a standalone one's from its args as stored, which is how they are derived
    again when it is read."""
    args_text, args_hash, args = _canonical(new.args)
    prompt = new.prompt or default_prompt(new.tool_name, new.args)
    texts = {"args": args_text}
    first: dict[str, Any] = {"args": args}
    named = {
        "tool_name": new.tool_name,
        "args": args_text,
        "args_hash": args_hash,
        "kind": new.kind,
        "prompt": prompt,
        "queue": new.queue,
        "status": _PENDING,
    }
    if run_id:
        named["run_id"] = run_id
        named["round"] = str(round_no)
    if new.data is not None:
        named["data"] = texts["data"] = _json(new.data)
        first["data"] = _loads(texts["data"])
    if new.metadata:
        named["metadata"] = texts["metadata"] = _json(new.metadata)
        first["metadata"] = _loads(texts["metadata"])
    if new.allowed_roles:
        named["allowed_roles"] = _json(new.allowed_roles)
    if new.kind == "approval":
        first["suggested_rules"] = suggest(
            new.tool_name, new.args if run_id else args, run_id, agent
        )
        if run_id:  # a standalone approval's suggested rules are derived when read
            named["suggested_rules"] = texts["suggested_rules"] = _json(first["suggested_rules"])
    if new.args_schema is not None:
        named["args_schema"] = texts["args_schema"] = canonical_json(new.args_schema)
        first["args_schema"] = _loads(texts["args_schema"])
    if new.callback:
        named["callback"] = new.callback
    if quorum != 1:
        named["quorum"] = str(quorum)
    if risk is not None:
        named["risk"] = risk
    if on_timeout == "reject":  # "escalate" is what the queue does anyway
        named["on_timeout"] = on_timeout
    if (parent := tracing.traceparent()) is not None:  # its deliveries and decision join it
        named["traceparent"] = parent
    values = {
        "run_id": run_id,
        "round": round_no,
        "tool_name": new.tool_name,
        "args_hash": args_hash,
        "kind": new.kind,
        "prompt": prompt,
        "queue": new.queue,
        "callback": new.callback or None,
        "quorum": quorum,
        "risk": risk,
    }
    return Encoded(named, values, texts, first)


_PENDING = Status.pending.value
_UNLIKE_JSON = (b"e+", b"e-", b"0.0000")  # checked in `_canonical`
"""Where a number orjson writes may differ from `json`'s: exponent forms, and below 1e-4
(`json` writes `1e-05` where orjson writes `0.00001`). Also found in some strings (`"one-"`):
those are written by `json`, only slower."""


def canonical_args(args: Any) -> tuple[str, str]:
    """`canonical_json(args)` and its sha256 (`args_hash`)."""
    text, digest, _ = _canonical(args)
    return text, digest


def _canonical(args: Any) -> tuple[str, str, Any]:
    """`canonical_args`, and the args decoded from that text (a fresh copy, as read back).
    orjson writes it when its text is the same: what it wrote reads back equal (no type `json`
    refuses or writes otherwise, no NaN or infinity, which it writes as null) and holds no
    `_UNLIKE_JSON`; else `json` does. A quarter of a distinct request's encoding before."""
    try:
        out = orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError is one: a type or an integer it refuses
        out = None
    if out is not None and not any(unlike in out for unlike in _UNLIKE_JSON):
        decoded = orjson.loads(out)  # orjson wrote it: no integer it would read as a float
        if decoded == args:
            return out.decode(), hashlib.sha256(out).hexdigest(), decoded
    text = canonical_json(args)
    return text, hashlib.sha256(text.encode()).hexdigest(), _loads(text)


def decided(request: Request, verdict: Any, at: datetime) -> Request:
    """`request` as create.lua writes it when a policy rule decides it (`verdict`,
    `broker.domain.rule_decided.RuleVerdict`) at `at`: its status, decision and one history entry."""
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
    return _installed({name: values[name] for name in _FIELDS})


def _installed(ordered: dict[str, Any]) -> Request:
    """A Request whose `__dict__` is `ordered`: every field, in `_FIELDS`' order."""
    request = Request.__new__(Request)
    _set(request, "__dict__", ordered)
    _set(request, "__pydantic_fields_set__", _ALL_SET)
    _set(request, "__pydantic_extra__", None)
    _set(request, "__pydantic_private__", None)
    return request


_PLAIN_JSON = {"args": dict, "metadata": dict, "args_schema": dict, "suggested_rules": list}
"""Fields typed as JSON values (`JsonValue`) that a JSON parser's output always is, once its
top level has the right type: kept out of the model's validation, which would walk them."""


def parse_request(raw: Fields) -> Request:
    """A request from its hash (HGETALL, or the field list a Lua step replies with). A malformed
    one raises (ValueError, or KeyError for a missing time), as validation would."""
    f: dict[str, Any] = as_str_dict(raw)
    parsed: dict[str, Any] = {}  # the plain JSON fields, validated by their top level only
    for name in JSON_FIELDS:
        text = f.get(name)
        if not text:
            f.pop(name, None)
            continue
        value = _loads(text)
        kind = _PLAIN_JSON.get(name)
        if (
            kind is not None
            and isinstance(value, kind)
            and (kind is dict or all(isinstance(item, dict) for item in value))
        ):
            parsed[name] = value
            del f[name]
        elif name == "data":
            parsed[name] = value  # any JSON value is one
            del f[name]
        else:
            f[name] = value
    for name in INTERNAL_FIELDS:
        f.pop(name, None)
    f["run_id"] = f.get("run_id") or None
    f["callback"] = f.get("callback") or None
    f["tool_call_id"] = f.get("tool_call_id") or f.get("id")
    f["created_at"] = from_timestamp(float(f["created_at"]))
    f["expires_at"] = from_timestamp(float(f["expires_at"]))
    if (
        "suggested_rules" not in f
        and "suggested_rules" not in parsed
        and f["run_id"] is None
        and f.get("kind", "approval") == "approval"
    ):
        args = parsed.get("args", f.get("args"))
        parsed["suggested_rules"] = suggest(f.get("tool_name", ""), args or {}, None, None)
    request = Request.model_validate(f)
    if parsed:
        request.__dict__.update(parsed)
        request.__pydantic_fields_set__.update(parsed)
    return request


def parse_flat(flat: list[str]) -> Request:
    """A request from a flat field, value, field, value... list (a Lua step's HGETALL)."""
    return parse_request(as_hash(flat))


def history_json(entry: HistoryEntry) -> str:
    return entry.model_dump_json(exclude_none=True)


def _json(value: Any) -> str:
    return to_json(value).decode()


def _loads(text: str | bytes) -> Any:
    """A fresh copy of stored JSON (`broker.redis.replies.json_loads`: exact for integers past 64 bits)."""
    return json_loads(text if isinstance(text, str) else text.decode())


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _copier(value: Any) -> Callable[[], Any]:
    """How each request gets its own copy of a structured value: the value itself when
    immutable, a copy of it when one level holds only immutable scalars (a list of such
    objects: each copied), else a fresh decode of its JSON text (nested values; a deep copy
    where it holds an integer past 64 bits)."""
    if type(value) in _SCALARS:
        return lambda: value
    if type(value) in (dict, list) and _flat(value.values() if type(value) is dict else value):
        return value.copy
    if type(value) is list and all(type(x) is dict and _flat(x.values()) for x in value):
        return lambda: [item.copy() for item in value]
    try:
        text = orjson.dumps(value)
    except TypeError:  # an integer past 64 bits, which orjson neither writes nor reads exactly
        return lambda: copy.deepcopy(value)
    return lambda: orjson.loads(text)  # orjson wrote it: no integer it would read as a float


def _flat(items: Iterable[Any]) -> bool:
    return all(type(x) in _SCALARS for x in items)
