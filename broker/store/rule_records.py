"""How a rule is kept in Redis: its hash fields (the key names are `broker.store.keys.RuleKeys`).

Times are epoch seconds so the create step's Lua can compare `expires_at` without parsing.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from broker.domain.rules.models import Rule
from broker.redis.replies import Fields, as_str
from broker.store.keys import RuleKeys

__all__ = ["RuleKeys", "epoch", "from_fields", "new_rule_id", "to_fields"]

_JSON = ("args", "creator_roles", "route")
_TIMES = ("created_at", "expires_at", "last_hit_at", "revoked_at")


def new_rule_id() -> str:
    """A sortable, unguessable id: milliseconds since the epoch in hex, then 48 random bits."""
    return f"rule_{int(time.time() * 1000):011x}{secrets.token_hex(6)}"


def epoch(value: datetime) -> str:
    return repr(value.timestamp())


def to_fields(rule: Rule) -> dict[str, str]:
    """The hash a rule is stored as (None fields left out)."""
    out: dict[str, str] = {}
    for name, value in rule.model_dump().items():
        if value is None:
            continue
        if name in _JSON:
            out[name] = json.dumps(value, separators=(",", ":"))
        elif name in _TIMES:
            out[name] = epoch(value)
        elif isinstance(value, bool):
            out[name] = "1" if value else "0"
        else:
            out[name] = str(value)
    return out


def from_fields(raw: Fields) -> Rule:
    data: dict[str, Any] = {}
    for key, value in raw.items():
        name, text = as_str(key), as_str(value)
        if name in _JSON:
            data[name] = json.loads(text)
        elif name in _TIMES:
            data[name] = datetime.fromtimestamp(float(text), UTC)
        elif name == "quorum_bypass":
            data[name] = text == "1"
        else:
            data[name] = text
    return Rule.model_validate(data)
