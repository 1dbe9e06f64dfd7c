"""Replaying rules against the audit trail: what they would have decided, against what
people (or other rules) did decide.

For each request created in the window (a `created` entry), its last outcome comes from the
trail (`decided`, `timed_out`), its call (tool, args, run, agent, queue) from the request as
still kept (`[broker] retention_s`), else from the `created` entry's detail (tool and queue:
a rule with arg matchers then can't be judged, and is counted `unknown`). Each rule is judged
alone, with the same matching the create step uses (`broker.domain.rules.matching`); a replayed rule
is taken as active (neither revoked nor expired). Nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase

from broker.audit.chain import Entry
from broker.domain.config import Config
from broker.domain.models import Request
from broker.domain.rules.matching import Call, in_queue, matches
from broker.domain.rules.models import Rule

AGREES = {"allow": {"approved"}, "deny": {"rejected"}, "route": set()}
"""What a rule's effect agrees with: an allow with an approval as asked (not modified args),
a deny with a rejection."""


@dataclass
class Seen:
    """One request of the window, as the trail tells it."""

    request_id: str
    tool: str = ""
    queue: str = "default"
    outcome: str = ""  # the last decided / timed_out outcome; '' while pending
    actor: str = ""
    actor_kind: str = ""


@dataclass
class RuleReport:
    """One rule's replay: the requests it would have decided, split by what happened."""

    rule: Rule
    would_decide: list[str] = field(default_factory=list)
    agreements: list[str] = field(default_factory=list)
    disagreements: list[tuple[str, str, str]] = field(default_factory=list)  # id, outcome, actor
    undecided: list[str] = field(default_factory=list)  # pending, or nobody answered in time
    unknown: list[str] = field(default_factory=list)  # args needed but the request is gone
    came_from: dict[str, int] = field(default_factory=dict)  # a route's: where they waited

    def line(self) -> str:
        r = self.rule
        mode = " (shadow)" if r.mode == "shadow" else ""
        if r.effect == "route" and r.route is not None:
            waited = ", ".join(f"{q} {n}" for q, n in sorted(self.came_from.items())) or "none"
            return (
                f"{r.id}{mode}  route {r.tool}: would route {len(self.would_decide)}"
                f" {where(r)}; they waited in: {waited}; unknown {len(self.unknown)}"
            )
        return (
            f"{r.id}{mode}  {r.effect} {r.tool}: would decide {len(self.would_decide)};"
            f" agreements {len(self.agreements)}, disagreements {len(self.disagreements)},"
            f" undecided {len(self.undecided)}, unknown {len(self.unknown)}"
        )


def requests_in(entries: Iterable[Entry]) -> dict[str, Seen]:
    """The requests created in the entries, with their last outcome, in order of creation."""
    seen: dict[str, Seen] = {}
    for e in entries:
        if e.event == "created" and e.request_id:
            detail = _detail(e.detail)
            if detail.get("kind", "approval") != "approval":
                continue  # rules decide approvals only
            seen[e.request_id] = Seen(
                e.request_id, str(detail.get("tool", "")), str(detail.get("queue", "default"))
            )
        elif e.event in ("decided", "timed_out") and e.request_id in seen:
            s = seen[e.request_id]
            s.outcome, s.actor, s.actor_kind = e.outcome, e.actor, e.actor_kind
    return seen


def _detail(text: str) -> dict[str, object]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def replay(
    rules: Iterable[Rule],
    seen: dict[str, Seen],
    kept: dict[str, Request],
    agents: dict[str, str],
    config: Config,
) -> list[RuleReport]:
    """Judge each rule alone against each request seen (`kept`: the requests still in Redis,
    `agents`: run id -> agent)."""
    now = datetime.now(UTC)
    reports = []
    for rule in rules:
        judged = rule.model_copy(update={"revoked_at": None, "expires_at": None, "mode": "enforce"})
        report = RuleReport(rule)
        for rid, s in seen.items():
            request = kept.get(rid)
            if request is not None:
                call = Call.of(request, agent=agents.get(request.run_id or ""))
            elif rule.args or rule.agent or rule.run_id:
                if _tool_covers(rule, s.tool):
                    report.unknown.append(rid)
                continue
            else:
                call = Call(tool_name=s.tool, queue=s.queue)
            if not matches(judged, in_queue(call, config), now):
                continue
            report.would_decide.append(rid)
            if rule.effect == "route":  # decides nothing: where it went instead
                report.came_from[s.queue] = report.came_from.get(s.queue, 0) + 1
                continue
            if s.outcome in ("", "timed_out"):
                report.undecided.append(rid)
            elif s.outcome in AGREES[rule.effect]:
                report.agreements.append(rid)
            else:
                report.disagreements.append((rid, s.outcome, s.actor))
        reports.append(report)
    return reports


def where(rule: Rule) -> str:
    """Where a route rule sends a request: `to finance (quorum 2, risk high)`."""
    route = rule.route
    if route is None:
        return ""
    parts = [f"{k.replace('_', ' ')} {v}" for k, v in route.public().items() if k != "queue"]
    to = f"to {route.queue}" if route.queue else "in the same queue"
    return f"{to} ({', '.join(parts)})" if parts else to


def _tool_covers(rule: Rule, tool: str) -> bool:
    return bool(tool) and (rule.tool == tool or fnmatchcase(tool, rule.tool))
