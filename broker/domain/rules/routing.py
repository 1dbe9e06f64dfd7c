"""Routing rules: which `route` rule applies to a call, and what it makes of the request.

A `route` rule decides nothing. When it matches an approval call (the same matchers as allow
and deny) it sets where and how the request waits: its queue, its quorum, its timeout, what
the sweeper does when nobody answers (`on_timeout`), and a risk label. Precedence (docs/
policy-rules.md): any matching deny, then any matching allow (both decide, so no route
applies), then the matching route with the highest `priority` (default 0); ties go to the most
specific (`specificity`), then the oldest, then the smallest id, so the answer is always one.

Pure functions over parsed rules and the config's queues: no Redis, no clock of their own.
The create step (`broker.store.creating`) matches with them and applies the result in its one
atomic step; the config loader and the rule store check a route's queue with `route_problem`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.domain.rules.matching import Call, matches
from broker.domain.rules.models import Rule, RuleBody, is_glob

DEFAULT_PRIORITY = 0


def specificity(rule: RuleBody) -> int:
    """How narrowly a rule is scoped: an exact tool name, each of agent, run_id and queue, and
    each arg matcher count one."""
    exact_tool = 0 if is_glob(rule.tool) else 1
    scoped = sum(1 for k in ("agent", "run_id", "queue") if getattr(rule, k) is not None)
    return exact_tool + scoped + len(rule.args or {})


def route_rank(rule: Rule) -> tuple[int, int, float, str]:
    """Smaller wins: the highest priority, then the most specific, then the oldest, then by id."""
    priority = rule.priority if rule.priority is not None else DEFAULT_PRIORITY
    return (-priority, -specificity(rule), rule.created_at.timestamp(), rule.id)


def choose_route(rules: Iterable[Rule], call: Call, now: datetime) -> Rule | None:
    """The route rule that applies to `call` among `rules` (route rules only are looked at), or
    None. The caller has already found that no allow or deny decides the call."""
    best: Rule | None = None
    for rule in rules:
        if rule.effect != "route" or not matches(rule, call, now):
            continue
        if best is None or route_rank(rule) < route_rank(best):
            best = rule
    return best


def route_problem(body: RuleBody, queues: Mapping[str, Any]) -> str | None:
    """What is wrong with a route against the configured queues (`field: text`), or None: a
    queue nothing defines, or `on_timeout = "escalate"` to a queue with nowhere to escalate."""
    route = body.route
    if route is None:
        return None
    if route.queue is not None and route.queue not in queues:
        return f"route.queue: queue {route.queue!r} is not defined"
    if route.on_timeout == "escalate" and route.queue is not None:
        if getattr(queues[route.queue], "escalate_to", None) is None:
            return (
                f"route.on_timeout: queue {route.queue!r} has no escalate_to, so nothing to"
                " escalate to (use 'reject', or give the queue an escalate_to)"
            )
    return None


@dataclass(frozen=True)
class Routed:
    """Where and how a routed request waits, resolved against the config."""

    rule_id: str
    queue: str
    quorum: int
    timeout_s: float
    on_timeout: str | None  # "reject" or "escalate"; None: as its queue says
    risk: str | None
    from_queue: str

    def entry(self) -> dict[str, Any]:
        """The request's history entry, without `at` (the step sets it on Redis's clock)."""
        route: dict[str, Any] = {"queue": self.queue, "quorum": self.quorum}
        route["timeout_s"] = self.timeout_s
        if self.on_timeout is not None:
            route["on_timeout"] = self.on_timeout
        route["risk"] = self.risk
        return {
            "event": "routed_by_rule",
            "by": f"rule:{self.rule_id}",
            "rule": self.rule_id,
            "from_queue": self.from_queue,
            "to_queue": self.queue,
            "route": route,
        }

    def describe(self) -> str:
        """`to finance (quorum 2, risk high)`: what a shadow route or a replay says."""
        parts = [f"quorum {self.quorum}"]
        if self.on_timeout is not None:
            parts.append(f"on timeout {self.on_timeout}")
        if self.risk is not None:
            parts.append(f"risk {self.risk}")
        return f"to {self.queue} ({', '.join(parts)})"


class QueueFacts:
    """What resolving a route reads of the config: each queue's timeout and quorum floor."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def known(self, queue: str) -> bool:
        return queue in self.config.queues

    def timeout(self, queue: str) -> float:
        return float(self.config.timeout_for(queue))

    def quorum(self, queue: str) -> int:
        return int(self.config.quorum_for(queue))


def resolve(
    rule: Rule,
    queue: str,
    asked_timeout_s: float | None,
    asked_quorum: int,
    facts: QueueFacts,
) -> Routed | None:
    """What `rule` makes of a request asked for `queue` (its own `timeout_s`, if any, and the
    quorum it would have had there): None when the route names a queue the config no longer
    defines (the request then waits where it was asked).

    The queue is the route's, else the asked one. The quorum is the largest of the route's,
    the new queue's floor and what the request asked: a route never lowers it. The timeout is
    the route's, else the request's own, else the new queue's.
    """
    route = rule.route
    if route is None:
        return None
    to = route.queue or queue
    if not facts.known(to):
        return None
    quorum = max(route.quorum or 1, facts.quorum(to), asked_quorum)
    if route.timeout_s is not None:
        timeout = float(route.timeout_s)
    elif asked_timeout_s is not None:
        timeout = float(asked_timeout_s)
    else:
        timeout = facts.timeout(to)
    return Routed(rule.id, to, quorum, timeout, route.on_timeout, route.risk, queue)
