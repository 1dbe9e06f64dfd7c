"""How a rule is kept in Redis: its key names and its hash fields.

Times are epoch seconds so the create step's Lua can compare `expires_at` without parsing.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from broker.rules.models import Rule, is_glob

_JSON = ("args", "creator_roles")
_TIMES = ("created_at", "expires_at", "last_hit_at", "revoked_at")


@dataclass(frozen=True)
class RuleKeys:
    """The rule key names (to move into broker.keys.Keys when the wiring lands)."""

    prefix: str = "ab:"

    def rule(self, rule_id: str) -> str:
        """Hash: one rule's fields; times as epoch seconds, args as JSON. Kept after revoke."""
        return f"{self.prefix}rule:{rule_id}"

    def by_tool(self, tool: str) -> str:
        """Set: ids of unrevoked rules whose `tool` is exactly this name."""
        return f"{self.prefix}rules:tool:{tool}"

    @property
    def globs(self) -> str:
        """Set: ids of unrevoked rules whose `tool` is a glob pattern."""
        return f"{self.prefix}rules:glob"

    @property
    def listing(self) -> str:
        """ZSET: every rule id (revoked ones too) scored by creation time."""
        return f"{self.prefix}rules"

    @property
    def from_config(self) -> str:
        """Set: ids of the rules the config file made (ever), to revoke ones it no longer has."""
        return f"{self.prefix}rules:config"

    @property
    def version(self) -> str:
        """String: incremented by every create and revoke; the in-process caches key on it."""
        return f"{self.prefix}rules:version"

    def index(self, tool: str) -> str:
        return self.globs if is_glob(tool) else self.by_tool(tool)


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


def from_fields(raw: dict[bytes, bytes]) -> Rule:
    data: dict[str, Any] = {}
    for key, value in raw.items():
        name, text = key.decode(), value.decode()
        if name in _JSON:
            data[name] = json.loads(text)
        elif name in _TIMES:
            data[name] = datetime.fromtimestamp(float(text), UTC)
        elif name == "quorum_bypass":
            data[name] = text == "1"
        else:
            data[name] = text
    return Rule.model_validate(data)
