"""A stored request hash straight to the JSON text of `Request.model_dump_json()`, with no
model in between: the `data` of a webhook body.

Why: validating a request into a `Request` and dumping it again was about 40% of a busy
notifier's time. Here the fields are checked by hand against the shapes the broker writes and
put in a dict in the model's field order, and orjson writes it (its numbers, strings and UTC
times are pydantic's; an integer past 64 bits goes to pydantic's `to_json`).

It must never accept a hash `parse_request` refuses, nor give other bytes than the model
(tests/integration/test_notify_body.py compares both over many shapes): anything outside the usual shapes
(a number written oddly, a time not in the broker's form, a field of the wrong type) gives
None, and the caller takes the pydantic way, which coerces or raises exactly as before.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import orjson
from pydantic_core import to_json

from broker.domain.models import KINDS, Decision, HistoryEntry, Outcome, Request, Status, Vote
from broker.domain.models import from_timestamp as _from_timestamp
from broker.domain.rules.matching import suggested_rules as _suggest
from broker.redis.replies import json_loads

Values = dict[str, Any]

_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})\Z")
"""An integer as the broker writes it (`str(n)`); others (`+1`, `01`, ` 1`) go to pydantic."""
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{6})?Z\Z")
"""A time as the Lua steps and pydantic write it (UTC, `Z`, no or six decimals)."""

_STATUSES = frozenset(s.value for s in Status)
_OUTCOMES = frozenset(o.value for o in Outcome)
_KINDS = frozenset(KINDS)
_DECISION = tuple(Decision.model_fields)
_ENTRY = tuple(HistoryEntry.model_fields)
_ENTRY_TEXT = tuple(n for n in _ENTRY[2:] if n != "route")  # after `at`, `event`: text
_VOTE = tuple(Vote.model_fields)
_LIMITS = {  # Decision's text fields and their max_length (None: no limit)
    "reason": 10_000,
    "target": 200,
    "args_hash": 128,
    "decided_by": None,
    "rule": None,
}
ORDER = (*Request.model_fields, *Request.model_computed_fields)
"""The keys `request_values` gives, in `model_dump_json`'s order (checked in the tests)."""


class _Unusual(Exception):
    """A value outside the shapes handled here: the pydantic way decides."""


def request_values(f: dict[str, str]) -> Values | None:
    """The values `Request.model_dump()` would give for hash `f` (decoded to text), times as
    datetimes; None when the hash is not in a shape this module knows (see the docstring)."""
    try:
        return _values(f)
    except (_Unusual, KeyError, ValueError, TypeError, OverflowError, OSError):
        return None


def request_json(values: Values) -> bytes:
    """`Request.model_dump_json()` for `request_values`' output, as bytes."""
    try:
        return orjson.dumps(values, option=orjson.OPT_UTC_Z)
    except TypeError:  # orjson.JSONEncodeError is one: an integer past 64 bits
        return to_json(values)


def _values(f: dict[str, str]) -> Values:
    get = f.get
    rid = f["id"]
    run_id = get("run_id") or None
    kind = get("kind", "approval")
    if kind not in _KINDS:
        raise _Unusual
    args = _json(get("args"), dict, {})
    suggested = get("suggested_rules")
    if suggested:
        rules = _json(suggested, list, None)
        if not all(type(rule) is dict for rule in rules):
            raise _Unusual
    elif run_id is None and kind == "approval":
        rules = _suggest(f["tool_name"], args, None, None)
    else:
        rules = []
    status = get("status", "pending")
    if status not in _STATUSES:
        raise _Unusual
    roles = _json(get("allowed_roles"), list, [])
    if not all(type(role) is str for role in roles):
        raise _Unusual
    decision = get("decision")
    history = _json(get("history"), list, [])
    approvals = _json(get("approvals"), list, [])
    votes = [_vote(v) for v in approvals]
    by_args: dict[str, int] = {}
    for vote in votes:
        by_args[vote["args_hash"]] = by_args.get(vote["args_hash"], 0) + 1
    acked_until = get("acked_until")
    return {
        "id": rid,
        "run_id": run_id,
        "round": _int(get("round"), 0),
        "tool_call_id": get("tool_call_id") or rid,
        "tool_name": f["tool_name"],
        "args": args,
        "args_hash": f["args_hash"],
        "kind": kind,
        "prompt": get("prompt", ""),
        "data": json_loads(f["data"]) if get("data") else None,
        "metadata": _json(get("metadata"), dict, {}),
        "queue": get("queue", "default"),
        "allowed_roles": roles,
        "callback": get("callback") or None,
        "created_at": _from_timestamp(float(f["created_at"])),
        "expires_at": _from_timestamp(float(f["expires_at"])),
        "status": status,
        "decision": _decision(json_loads(decision)) if decision else None,
        "history": [_entry(e) for e in history],
        "suggested_rules": rules,
        "escalations": _int(get("escalations"), 0),
        "args_schema": _json(get("args_schema"), dict, None),
        "quorum": _int(get("quorum"), 1),
        "approvals": votes,
        "created_by": get("created_by") or None,
        "acked_by": get("acked_by") or None,
        "acked_until": _from_timestamp(float(acked_until)) if acked_until else None,
        "risk": get("risk") or None,
        "approvals_by_args": by_args,
    }


def _json(text: str | None, kind: type, default: Any) -> Any:
    """Stored JSON text of the top-level type `kind`; missing or empty is the default."""
    if not text:
        return default
    value = json_loads(text)
    if type(value) is not kind:
        raise _Unusual
    return value


def _int(text: str | None, default: int) -> int:
    if text is None:
        return default
    if not _INT.match(text):
        raise _Unusual
    return int(text)


def _time(value: Any) -> datetime:
    if type(value) is not str or not _TIME.match(value):
        raise _Unusual
    return datetime.fromisoformat(value)


def _text(value: Any, limit: int | None = None) -> str | None:
    if value is None:
        return None
    if type(value) is not str or (limit is not None and len(value) > limit):
        raise _Unusual
    return value


def _decision(raw: Any) -> Values:
    """`Decision.model_dump()` of a stored decision, checked as its validators would."""
    if type(raw) is not dict:
        raise _Unusual
    out = {name: raw.get(name) for name in _DECISION}
    outcome = out["outcome"]
    if type(outcome) is not str or outcome not in _OUTCOMES:
        raise _Unusual
    for name, limit in _LIMITS.items():
        _text(out[name], limit)
    for name in ("args", "metadata"):
        if out[name] is not None and type(out[name]) is not dict:
            raise _Unusual
    if out["decided_at"] is not None:
        out["decided_at"] = _time(out["decided_at"])
    if (outcome == "modified") != (out["args"] is not None):
        raise _Unusual  # a modified decision without args, or args on another
    if outcome != "escalated" and out["target"] is not None:
        raise _Unusual
    return out


def _entry(raw: Any) -> Values:
    """`HistoryEntry.model_dump()` of a stored history entry."""
    if type(raw) is not dict or type(raw.get("event")) is not str:
        raise _Unusual
    out = {"at": _time(raw.get("at")), "event": raw["event"]}
    for name in _ENTRY_TEXT:
        out[name] = _text(raw.get(name))
    route = raw.get("route")
    if route is not None and type(route) is not dict:
        raise _Unusual
    out["route"] = route  # in `_ENTRY`'s order: the last field (checked below)
    return out


def _vote(raw: Any) -> Values:
    """`Vote.model_dump()` of a stored vote."""
    if type(raw) is not dict:
        raise _Unusual
    by, args_hash, channel = raw.get("by"), raw.get("args_hash"), raw.get("channel", "")
    if type(by) is not str or type(args_hash) is not str or type(channel) is not str:
        raise _Unusual
    return {"by": by, "at": _time(raw.get("at")), "args_hash": args_hash, "channel": channel}


assert _VOTE == ("by", "at", "args_hash", "channel"), _VOTE  # `_vote` writes these, in order
assert _ENTRY[:2] == ("at", "event") and _ENTRY[-1] == "route", _ENTRY
