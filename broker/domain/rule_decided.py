"""What a request decided by a policy rule records: its status, decision and history entry.

Written by the create step (a call a rule covers) and the remember step (pending siblings a
newly remembered rule covers), so both read the same. `decided_at` and the entry's `at` are left
out: the Lua step sets them on Redis's clock. This module never touches Redis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from broker.domain.models import Decision, HistoryEntry, Outcome, Status, utcnow
from broker.domain.receipts import CallFacts, Receipts
from broker.domain.rules.models import Rule

EFFECT_OUTCOME = {"allow": Outcome.approved, "deny": Outcome.rejected}
OUTCOME_EFFECT = {Outcome.approved: "allow", Outcome.rejected: "deny"}


def decided_by(rule_id: str) -> str:
    return f"rule:{rule_id}"


def default_reason(rule: Rule) -> str | None:
    """What the model is told of a deny without a reason of its own."""
    if rule.effect == "deny":
        return rule.reason or f"Denied by policy rule {rule.id}."
    return rule.reason


@dataclass(frozen=True)
class RuleVerdict:
    """How one rule decides one request."""

    rule_id: str
    effect: str
    decision: Decision
    entry: HistoryEntry

    @property
    def status(self) -> Status:
        return Status.approved if self.effect == "allow" else Status.rejected

    def receipted(self, receipts: Receipts | None, call: CallFacts) -> RuleVerdict:
        """This verdict on one call, its decision carrying that call's receipt (an allow)."""
        if receipts is None:
            return self
        by = self.decision.decided_by or decided_by(self.rule_id)
        return replace(self, decision=receipts.stamp(call, self.decision, decided_by=by))

    def decision_json(self) -> str:
        return json.dumps(self.decision.public(), separators=(",", ":"), ensure_ascii=False)

    def entry_json(self) -> str:
        data = self.entry.model_dump(mode="json", exclude_none=True)
        data.pop("at", None)  # set by the step
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    def lua(self) -> dict[str, Any]:
        """The `rule` part of a create.lua request item."""
        return {
            "id": self.rule_id,
            "effect": self.effect,
            "status": self.status.value,
            "decision": self.decision_json(),
            "entry": self.entry_json(),
        }


def verdict_for(rule: Rule) -> RuleVerdict:
    by = decided_by(rule.id)
    reason = default_reason(rule)
    decision = Decision(
        outcome=EFFECT_OUTCOME[rule.effect], reason=reason, decided_by=by, rule=rule.id
    )
    entry = HistoryEntry(at=utcnow(), event="decided_by_rule", by=by, rule=rule.id, reason=reason)
    return RuleVerdict(rule.id, rule.effect, decision, entry)
