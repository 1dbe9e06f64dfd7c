"""Deciding which rules cover a tool call, and what a person may remember.

Pure functions over parsed rules: no Redis, no clock of their own (callers pass `now`), so the
same answer comes from the API, the create step and the tests.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from broker.domain.config import Config
from broker.domain.errors import Forbidden
from broker.domain.principals import Principal
from broker.domain.rules.models import COMPARISONS, Decides, Rule, RuleBody, is_number

POLICY = "policy"
AUDITOR = "auditor"
REQUESTER = "requester"
_MISSING = object()


@dataclass(frozen=True)
class Call:
    """What a rule is matched against: one tool call, in its run, agent and handler queue."""

    tool_name: str
    args: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    agent: str | None = None
    queue: str = "default"
    kind: str = "approval"
    allowed_roles: tuple[str, ...] = ()
    queue_roles: tuple[str, ...] = ()  # the queue's minimum roles (`Config.queue_roles`)
    queue_channels: tuple[str, ...] = ()  # the channels the queue is decided through
    created_by: str | None = None  # who asked for the call (a run's starter, an API caller)

    @classmethod
    def of(cls, request: Any, agent: str | None = None) -> Call:
        """The call a Request or NewRequest (with its run's agent) stands for."""
        return cls(
            tool_name=request.tool_name,
            args=dict(request.args or {}),
            run_id=getattr(request, "run_id", None),
            agent=agent,
            queue=request.queue,
            kind=request.kind,
            allowed_roles=tuple(request.allowed_roles or ()),
            created_by=getattr(request, "created_by", None),
        )


def arg_at(args: Any, path: str) -> Any:
    """The value at a dotted path (`customer.id`, `items.0.sku`), or _MISSING."""
    node = args
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True is not 1 and "1" is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if is_number(a) and is_number(b):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def matcher_holds(matcher: Any, value: Any) -> bool:
    """One matcher against one argument value (a validated matcher; see models.check_matcher)."""
    if not isinstance(matcher, dict):
        return same(matcher, value)
    ((op, operand),) = matcher.items()
    if op == "eq":
        return same(operand, value)
    if op == "in":
        return any(same(option, value) for option in operand)
    if op in COMPARISONS:
        if not is_number(value):
            return False
        return {
            "lt": value < operand,
            "le": value <= operand,
            "gt": value > operand,
            "ge": value >= operand,
        }[op]
    if op == "prefix":
        return isinstance(value, str) and value.startswith(operand)
    if op == "glob":
        return isinstance(value, str) and fnmatchcase(value, operand)
    return False


def in_queue(call: Call, config: Config) -> Call:
    """`call` with its queue's roles and channels from `config`, which matching judges by."""
    queue = config.queues.get(call.queue)
    return replace(
        call,
        queue_roles=tuple(queue.roles) if queue else (),
        queue_channels=tuple(c for c in queue.channels if config.decides_through(c))
        if queue
        else (),
    )


def covers_roles(rule: Rule, call: Call) -> bool:
    """A rule made without role `policy` covers only requests its creator could decide, through
    the channel it was made in: one of the queue's roles when it has any, one of the request's
    `allowed_roles` when it has any, and its channel among the queue's (`in_queue` fills both;
    a rule kept before channels were recorded has none and is judged by roles only)."""
    if rule.creator_roles is None:
        return True
    if rule.creator_channel is not None and rule.creator_channel not in call.queue_channels:
        return False
    creator = set(rule.creator_roles)
    if call.queue_roles and not creator.intersection(call.queue_roles):
        return False
    return not call.allowed_roles or bool(creator.intersection(call.allowed_roles))


def own_call(rule: Rule, call: Call) -> bool:
    """A person's rule never decides a call that same person asked for (the two-person rule);
    a rule of role `policy` or of the config may."""
    return rule.creator_roles is not None and call.created_by == rule.created_by


def matches(rule: Rule, call: Call, now: datetime) -> bool:
    """Does this active rule's tool, scope and every arg matcher hold for the call?"""
    if not rule.is_active(now) or call.kind != "approval":
        return False
    if rule.tool != call.tool_name and not fnmatchcase(call.tool_name, rule.tool):
        return False
    if rule.agent is not None and rule.agent != call.agent:
        return False
    if rule.run_id is not None and rule.run_id != call.run_id:
        return False
    if rule.queue is not None and rule.queue != call.queue:
        return False
    if not covers_roles(rule, call) or own_call(rule, call):
        return False
    for path, matcher in (rule.args or {}).items():
        value = arg_at(call.args, path)
        if value is _MISSING or not matcher_holds(matcher, value):
            return False
    return True


def evaluate(rules: Iterable[Rule], call: Call, now: datetime) -> tuple[Decides, Rule] | None:
    """The deciding rule: any matching deny beats any matching allow; None means ask a person
    (a `route` rule decides nothing: `broker.domain.rules.routing` chooses among those).

    Among several matches of the same effect the oldest wins, so the answer is deterministic.
    """
    best: Rule | None = None
    for rule in rules:
        if rule.effect == "route" or not matches(rule, call, now):
            continue
        if best is None or _rank(rule) < _rank(best):
            best = rule
    if best is None:
        return None
    return ("deny" if best.effect == "deny" else "allow"), best


def _rank(rule: Rule) -> tuple[bool, datetime, str]:
    """Denies first, then the oldest, then by id."""
    return (rule.effect != "deny", rule.created_at, rule.id)


def _natural_narrowing(args: dict[str, Any]) -> dict[str, Any] | None:
    """One arg matcher a person would likely mean: the same directory, or an amount at most this."""
    for key, value in args.items():
        if isinstance(value, str) and "/" in value:
            directory = posixpath.dirname(value.rstrip("/"))
            if directory and directory != "/":
                return {key: {"prefix": directory.rstrip("/") + "/"}}
    for key, value in args.items():
        if is_number(value):
            return {key: {"le": value}}
    return None


def suggested_rules(
    tool_name: str, args: dict[str, Any], run_id: str | None, agent: str | None
) -> list[dict[str, Any]]:
    """Rule bodies offered with an approval request, broadest-scope last.

    "This tool, this run", "this tool, this agent", and one narrowed by an argument where that
    is natural (same path prefix, amount at most this one), scoped to the agent or else the run.
    A call with neither run nor agent gets the tool-wide rule, which only role `policy` may keep.
    """
    suggestions: list[dict[str, Any]] = []
    if run_id is not None:
        suggestions.append({"effect": "allow", "tool": tool_name, "run_id": run_id})
    if agent is not None:
        suggestions.append({"effect": "allow", "tool": tool_name, "agent": agent})
    narrowed = _natural_narrowing(args)
    if narrowed is not None:
        scope = {"agent": agent} if agent is not None else {"run_id": run_id} if run_id else {}
        suggestions.append({"effect": "allow", "tool": tool_name, **scope, "args": narrowed})
    if not suggestions:
        suggestions.append({"effect": "allow", "tool": tool_name})
    return suggestions


def can_approve(principal: Principal) -> bool:
    """Whether the principal decides anything at all (requesters and auditors do not)."""
    return principal.decides_anything()


def may_remember(
    principal: Principal,
    body: RuleBody,
    request: Any | None = None,
    queue_roles: Collection[str] = (),
) -> None:
    """Refuse (Forbidden) a rule that would grant more than its creator could decide.

    Role `policy` (or the admin) may create any rule, and only they a `route` rule (it moves
    requests between queues and sets their quorum). Anyone else needs a rule scoped to a
    `run_id` or an `agent`, may not set `quorum_bypass`, and must be able to decide `request`
    (when the rule is remembered from one) and, for a rule naming a `queue`, hold one of that
    queue's roles (`queue_roles`); the rule then covers only requests whose `allowed_roles` and
    queue roles the creator satisfies (see `covers_roles`).
    """
    if principal.has_role(POLICY):
        return
    if body.effect == "route":
        raise Forbidden("only role 'policy' (or the admin) may create route rules")
    if not can_approve(principal):
        raise Forbidden(f"{principal.name!r} decides nothing, so may not create rules")
    if body.run_id is None and body.agent is None:
        raise Forbidden("a rule without role 'policy' must be scoped to a run_id or an agent")
    if body.quorum_bypass:
        raise Forbidden("quorum_bypass needs role 'policy'")
    if body.queue is not None and queue_roles and not principal.roles.intersection(queue_roles):
        raise Forbidden(
            f"{principal.name!r} may not decide in queue {body.queue}"
            f" ({', '.join(queue_roles)}), so may not make a rule for it"
        )
    if request is not None and not principal.may_decide(request):
        raise Forbidden(f"{principal.name!r} may not decide this request, so may not remember it")


def creator_channel_for(principal: Principal, channel: str) -> str | None:
    """What a new rule records of the channel it was made through: None for `policy`."""
    if principal.has_role(POLICY):
        return None
    return channel


def creator_roles_for(principal: Principal) -> list[str] | None:
    """What a new rule records of its creator: None (any request) for `policy`, else the roles."""
    if principal.has_role(POLICY):
        return None
    return sorted(principal.roles - {REQUESTER, AUDITOR})
