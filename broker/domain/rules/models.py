"""Policy rules as data: the Rule a store holds and the RuleBody a caller gives, with matchers.

Every check names the field it refuses (`args.amount: unknown matcher 'between'`), so the API,
the config loader and the CLI can show it as is. This module never touches Redis.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from broker.domain.errors import InvalidInput
from broker.domain.models import MAX_QUORUM

CONFIG_CREATOR = "config"
"""`created_by` of a rule the config holds (`[[rules]]`), never a person's name."""

Effect = Literal["allow", "deny", "route"]
"""`allow` and `deny` decide a request at create; `route` decides nothing: it sets where and how
the request waits (`RouteSpec`, `broker.domain.rules.routing`)."""
Decides = Literal["allow", "deny"]
OnTimeout = Literal["reject", "escalate"]
Mode = Literal["enforce", "shadow"]
"""`shadow`: the rule decides nothing; each request it would have decided records that instead
(`shadow_rule` in the history and the audit trail, a metric): a rule tried before trusted."""
RULE_ID_PATTERN = r"^[A-Za-z0-9_.-]+$"
COMPARISONS = ("lt", "le", "gt", "ge")
MATCHERS = ("eq", "in", *COMPARISONS, "prefix", "glob")
GLOB_CHARS = frozenset("*?[")
_SEGMENT = re.compile(r"^[^.\s][^.]*$")


def is_number(value: Any) -> bool:
    """A JSON number: int or finite float, never a bool (True is not 1 here)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and not (isinstance(value, float) and not math.isfinite(value))
    )


def is_glob(pattern: str) -> bool:
    return any(c in GLOB_CHARS for c in pattern)


def _field_error(path: str, message: str) -> PydanticCustomError:
    """A validation error whose location continues below the field (an arg path, a matcher)."""
    return PydanticCustomError("rule_field", "{message}", {"path": path, "message": message})


def check_matcher(path: str, matcher: Any) -> None:
    """Refuse a matcher that is not a literal or exactly one known operator with a fitting operand."""
    if not isinstance(matcher, dict):
        return  # a literal: equals
    if len(matcher) != 1:
        raise _field_error(path, f"a matcher is a literal or exactly one of {', '.join(MATCHERS)}")
    ((op, operand),) = matcher.items()
    if op not in MATCHERS:
        raise _field_error(path, f"unknown matcher {op!r} (use one of {', '.join(MATCHERS)})")
    if op == "in" and (not isinstance(operand, list) or not operand):
        raise _field_error(f"{path}.in", "must be a non-empty list")
    if op in COMPARISONS and not is_number(operand):
        raise _field_error(f"{path}.{op}", "must be a number")
    if op in ("prefix", "glob") and not isinstance(operand, str):
        raise _field_error(f"{path}.{op}", "must be a string")
    if op == "glob" and not operand:
        raise _field_error(f"{path}.{op}", "an empty glob matches nothing; give a pattern")


class RouteSpec(BaseModel):
    """What a `route` rule sets for the requests it matches (each part optional): the queue
    they wait in, the approvals they need (at least; a queue or request asking more keeps
    more), how long they wait, what silence does then, and a risk label every card shows."""

    model_config = ConfigDict(extra="forbid")

    queue: str | None = Field(default=None, min_length=1, max_length=200)
    quorum: int | None = Field(default=None, ge=1, le=MAX_QUORUM)
    timeout_s: float | None = Field(default=None, gt=0, le=365 * 86400)
    on_timeout: OnTimeout | None = None
    risk: str | None = Field(default=None, min_length=1, max_length=200)

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def _check_arg_path(path: str) -> None:
    if not path or not all(_SEGMENT.match(part) for part in path.split(".")):
        raise _field_error(path, "an arg path is dotted names, as in 'customer.id'")


class RuleBody(BaseModel):
    """What a caller gives to make a rule; the store fills in who, when and the counters."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, min_length=1, max_length=200, pattern=RULE_ID_PATTERN)
    effect: Effect
    tool: str = Field(min_length=1, max_length=200, description="glob on tool_name")
    agent: str | None = Field(default=None, min_length=1, max_length=200)
    run_id: str | None = Field(default=None, min_length=1, max_length=200)
    queue: str | None = Field(default=None, min_length=1, max_length=200)
    args: dict[str, JsonValue] | None = Field(
        default=None, description="dotted arg path -> matcher; none: every call of the tool"
    )
    reason: str | None = Field(default=None, max_length=10_000)
    expires_at: datetime | None = None
    quorum_bypass: bool = False
    mode: Mode = "enforce"
    route: RouteSpec | None = Field(
        default=None, description="effect `route` only: where and how a matched request waits"
    )
    priority: int | None = Field(
        default=None,
        ge=-1_000_000,
        le=1_000_000,
        description="effect `route` only: the highest wins among matching routes (default 0)",
    )

    @field_validator("tool")
    @classmethod
    def _tool_glob(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("an empty glob matches nothing; give a tool name or pattern")
        return value

    @field_validator("args")
    @classmethod
    def _matchers(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for path, matcher in (value or {}).items():
            _check_arg_path(path)
            check_matcher(path, matcher)
        return value

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must carry a time zone, as in 2026-12-31T00:00:00Z")
        return value

    @model_validator(mode="after")
    def _route_goes_with_its_effect(self) -> RuleBody:
        if self.effect == "route":
            if self.route is None or not self.route.public():
                raise _field_error(
                    "route",
                    "a route rule sets at least one of queue, quorum, timeout_s, on_timeout, risk",
                )
        elif self.route is not None:
            raise _field_error("route", "only a rule with effect 'route' has a route")
        elif self.priority is not None:
            raise _field_error("priority", "only a rule with effect 'route' has a priority")
        if self.effect == "route" and self.quorum_bypass:
            raise _field_error("quorum_bypass", "a route decides nothing, so bypasses no quorum")
        return self

    @property
    def scope(self) -> dict[str, str]:
        """The scope fields that are set."""
        return {k: v for k in ("agent", "run_id", "queue") if (v := getattr(self, k)) is not None}


class Rule(RuleBody):
    """A stored rule: a body plus who made it, when, how often it decided, and if it was revoked."""

    id: str = Field(min_length=1, max_length=200, pattern=RULE_ID_PATTERN)
    created_by: str
    created_at: datetime
    from_request: str | None = None
    hits: int = 0
    last_hit_at: datetime | None = None
    revoked_at: datetime | None = None
    creator_roles: list[str] | None = Field(
        default=None,
        description="the roles of a creator without role policy: the rule covers only requests "
        "they could decide; null means any request",
    )
    creator_channel: str | None = Field(
        default=None,
        description="the channel a creator without role policy made the rule through (inbox,"
        " slack:NAME, email:NAME, webhook:NAME): the rule covers only requests waiting in a queue"
        " that lists it; null on a policy rule, and on a rule kept before channels were recorded"
        " (those are checked by roles only)",
    )

    def is_active(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def error_text(exc: ValidationError, where: str = "") -> str:
    """`rules[2].args.amount: unknown matcher 'between'` for the first error; no input echoed."""
    parts = []
    for err in exc.errors()[:3]:
        loc = [str(p) for p in err.get("loc", ())]
        ctx = err.get("ctx") or {}
        if err.get("type") == "rule_field":
            loc.append(str(ctx["path"]))
            msg = str(ctx["message"])
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field"
        else:
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        path = ".".join(loc)
        if where:
            path = f"{where}.{path}" if path else where
        parts.append(f"{path}: {msg}" if path else msg)
    return "; ".join(parts) or "invalid rule"


def parse_body(raw: Any, where: str = "") -> RuleBody:
    """A RuleBody from untrusted JSON, or InvalidInput `invalid_rule` naming the field."""
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where or 'rule'}: must be an object", code="invalid_rule")
    try:
        return RuleBody.model_validate(raw)
    except ValidationError as exc:
        raise InvalidInput(error_text(exc, where), code="invalid_rule") from None
