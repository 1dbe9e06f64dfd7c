"""A decision that remembers: decide one approval and keep a rule for the calls like it.

Every channel that offers "always" (REST and the inbox, Slack's modal, the email link, the CLI)
ends here, after the same who-may-decide checks as any decision (`broker.judge.deciding`). The rule,
the decision and the run's pending siblings the rule covers are written in one Lua step
(remember.lua), so the round resumes exactly once. This module never speaks HTTP.

A remembered rule never grants more than its creator could decide (`may_remember`), and a
request that needs more than one vote can't be remembered except by role `policy`.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from redis.cluster import RedisCluster

from broker.audit.actors import actor_args
from broker.domain.errors import Conflict, InvalidInput
from broker.domain.ids import run_of_request
from broker.domain.models import Decision, HistoryEntry, Request, utcnow
from broker.domain.persons import voter_of
from broker.domain.principals import EVERY_ROLE, Principal
from broker.domain.printable import printable
from broker.domain.receipts import call_facts
from broker.domain.rule_decided import OUTCOME_EFFECT, verdict_for
from broker.domain.rules.matching import (
    POLICY,
    Call,
    creator_channel_for,
    creator_roles_for,
    in_queue,
    matches,
    may_remember,
)
from broker.domain.rules.models import Rule, RuleBody, parse_body
from broker.judge.deciding import Decided, Deciding, same_decision
from broker.redis.replies import as_str
from broker.store.decisions import OUTCOME_STATUS, Once
from broker.store.rule_records import new_rule_id, to_fields
from broker.store.rule_store import RuleExists, may_bypass

Remember = int | dict[str, Any]
"""An index into the request's `suggested_rules`, or a rule body."""

_TRIES = 5


@dataclass(frozen=True)
class Remembered(Decided):
    """The decided request, the rule kept (None on a harmless repeat) and the siblings it decided."""

    rule: Rule | None = None
    siblings: tuple[str, ...] = ()


def rule_body(remember: Remember, request: Request, decision: Decision) -> RuleBody:
    """The rule `remember` names, its effect following the outcome (approved: allow)."""
    effect = OUTCOME_EFFECT[decision.outcome]
    if isinstance(remember, bool) or not isinstance(remember, int | dict):
        raise InvalidInput(
            "remember: give the index of a suggested rule or a rule body", code="invalid_rule"
        )
    mode: dict[str, Any] = {}
    if (
        isinstance(remember, dict)
        and set(remember) <= {"suggested", "mode"}
        and "suggested" in remember
    ):
        # "try this rule": a suggested rule, kept in shadow (`{"suggested": 0, "mode": "shadow"}`)
        mode = {"mode": remember["mode"]} if "mode" in remember else {}
        remember = remember["suggested"]
        if isinstance(remember, bool) or not isinstance(remember, int):
            raise InvalidInput(
                "remember.suggested: give the index of a suggested rule", code="invalid_rule"
            )
    if isinstance(remember, int):
        if not 0 <= remember < len(request.suggested_rules):
            raise InvalidInput(
                f"remember: request {request.id} has {len(request.suggested_rules)} suggested"
                f" rules; {remember} is none of them",
                code="invalid_rule",
            )
        raw: dict[str, Any] = {**request.suggested_rules[remember], "effect": effect, **mode}
    else:
        raw = {"effect": effect, **remember}
    body = parse_body(raw, "remember")
    if body.effect != effect:
        raise InvalidInput(
            f"remember.effect: an {decision.outcome.value!r} decision remembers an {effect!r} rule",
            code="invalid_rule",
        )
    if body.effect == "deny" and body.reason is None and decision.reason:
        body = body.model_copy(update={"reason": decision.reason})
    return body


def run_rule_index(request: Request) -> int | None:
    """Which of the request's suggested rules is "this tool, this run" (the email link's)."""
    for i, rule in enumerate(request.suggested_rules):
        if rule.get("run_id") and not rule.get("args"):
            return i
    return None


class RuleDecisions:
    """Decide-and-remember on the broker behind `deciding`."""

    def __init__(self, deciding: Deciding) -> None:
        self.deciding = deciding
        self.broker = deciding.broker
        self.rules = deciding.broker.requests.rules

    def decide(
        self,
        request_id: str,
        decision: Decision,
        principal: Principal,
        remember: Remember,
        *,
        via: Collection[str],
        decided_by: str | None = None,
        once: Once | None = None,
    ) -> Remembered:
        """Decide `request_id` as `Deciding.decide` does, and keep the rule `remember` names.

        Raises what `Deciding.decide` raises, plus InvalidInput `invalid_rule` (a bad body, an
        outcome other than approved/rejected, a request of another kind or of quorum > 1
        without role `policy`) and Forbidden (a rule wider than its creator may decide).
        """
        if decision.outcome not in OUTCOME_EFFECT:
            raise InvalidInput(
                "remember goes only with an 'approved' or 'rejected' decision",
                code="invalid_rule",
            )
        decided_by = printable(decided_by or principal.name)
        self.deciding.check_channels(principal, via)
        current = self.broker.get_request(request_id)
        self.deciding.check_may_decide(principal, current, via)
        self.deciding.check_not_creator(principal, current, decision, decided_by)
        if not current.is_pending:  # a repeat, or who won: as any decision
            done = self.deciding.decide(
                request_id,
                decision,
                principal,
                via=via,
                decided_by=decided_by,
                current=current,
                once=once,
            )
            return Remembered(done.request, recorded=done.recorded)
        if current.kind != "approval":
            raise InvalidInput(
                f"rules decide only approval requests; {current.id} is a {current.kind}",
                code="invalid_rule",
            )
        decision = self.deciding.check_applies(decision, current)
        body = rule_body(remember, current, decision)
        if int(getattr(current, "quorum", 1) or 1) > 1 and not (
            principal.has_role(POLICY) and body.quorum_bypass
        ):
            raise InvalidInput(
                f"request {current.id} needs more than one vote; only role 'policy' may"
                " remember a rule from it, and only one with quorum_bypass",
                code="invalid_rule",
            )
        may_remember(principal, body, current, self.broker.config.queue_roles(body.queue or ""))
        self.rules.check_names(body, "remember")
        if body.expires_at is not None and body.expires_at <= self.rules.now():
            raise InvalidInput("remember.expires_at: is already past", code="invalid_rule")
        rule = Rule.model_validate(
            {
                **body.model_dump(),
                "id": body.id or new_rule_id(),
                "created_by": decided_by,
                "created_at": utcnow(),
                "from_request": current.id,
                "creator_roles": creator_roles_for(principal),
                "creator_channel": creator_channel_for(
                    principal, self.deciding.channel_of(current, via)
                ),
            }
        )
        # a shadow rule decides nothing: not even the run's other calls it covers
        siblings = self._covered_siblings(current, rule) if rule.mode == "enforce" else []
        try:
            result = self._step(current, decision, principal, decided_by, rule, siblings, once)
        except Conflict as exc:
            if exc.code == "conflict" and same_decision(exc.request.decision, decision, decided_by):
                return Remembered(exc.request, recorded=False)
            raise
        return result

    def _covered_siblings(self, request: Request, rule: Rule) -> list[Request]:
        """The other pending requests of the request's run that the new rule covers."""
        if not request.run_id:
            return []
        keys, redis = self.broker.keys, self.broker.redis
        ids = [as_str(i) for i in redis.smembers(keys.run_pending(request.run_id))]
        agent = redis.hget(keys.run(request.run_id), "agent")
        agent_name = as_str(agent) if agent else None
        now = self.rules.now()
        found = []
        for sibling in self.broker.get_requests(sorted(i for i in ids if i != request.id)):
            call = in_queue(
                replace(Call.of(sibling, agent=agent_name), run_id=sibling.run_id),
                self.broker.config,
            )
            quorum = int(getattr(sibling, "quorum", 1) or 1)
            if sibling.is_pending and may_bypass(rule, quorum) and matches(rule, call, now):
                found.append(sibling)
        return found

    def _step(
        self,
        current: Request,
        decision: Decision,
        principal: Principal,
        decided_by: str,
        rule: Rule,
        siblings: list[Request],
        once: Once | None,
    ) -> Remembered:
        store = self.broker.store
        recorded = decision.model_copy(update={"decided_by": decided_by, "decided_at": None})
        receipts = store.receipts
        if receipts is not None:  # the person's decision, and each sibling the rule decides
            recorded = receipts.stamp(call_facts(current), recorded, decided_by=decided_by)
        entry = HistoryEntry(at=utcnow(), event="rule_created", by=decided_by, rule=rule.id)
        entry_data = entry.model_dump(mode="json", exclude_none=True)
        entry_data.pop("at")
        verdict = verdict_for(rule)
        sibling_verdicts = [verdict.receipted(receipts, call_facts(s)) for s in siblings]
        fields = {k: v for k, v in to_fields(rule).items() if k != "created_at"}
        once_key, once_ttl = once if once else (None, None)
        run_id = run_of_request(current.id)
        extra: list[str] = []
        values: dict[str, Any] = {
            "id": current.id,
            "outcome": decision.outcome.value,
            "status": OUTCOME_STATUS[decision.outcome].value,
            "decision": json.dumps(recorded.public(), separators=(",", ":"), ensure_ascii=False),
            "in_queue": current.queue,
            "in_escalation": current.escalations,
            "voter": voter_of(self.broker.config, decided_by),
            "entry": json.dumps(entry_data, separators=(",", ":")),
            "rule": {"id": rule.id, "effect": rule.effect, "fields": fields},
            "siblings": [
                {"id": s.id, "decision": v.decision_json(), "entry": v.entry_json()}
                for s, v in zip(siblings, sibling_verdicts, strict=True)
            ],
            "sibling_status": verdict.status.value,
            **actor_args(decided_by),
            "maxlen": store.maxlen,
            "retention": store.retention,
        }
        if decision.args_hash:
            values["args_hash"] = decision.args_hash
        if EVERY_ROLE in principal.roles:  # the admin and the shell, as for a decision
            values["creator_may_vote"] = True
        if once_key:
            values["once_ttl"] = once_ttl
        clustered = isinstance(store.redis, RedisCluster)
        if clustered:
            # The rules' slot is not the request's: the rule first, in a step of its own, but
            # matching nothing until the decision happened (`activate`), so a remember that
            # loses never decides another request; taken back on any failure.
            self.rules.insert(rule, where="remember.id", indexed=False)
        active = False
        try:
            for _ in range(_TRIES):
                ids = [s.id for s in siblings]
                queues = [*store.config.queues, *extra]
                if clustered:
                    keys = store.keys.decide_keys(current.id, run_id, queues, once_key)
                    for sid in ids:
                        keys.of_request(sid, "req", store.keys.request(sid))
                else:
                    keys = store.keys.remember_keys(
                        current.id, run_id, queues, once_key, rule.id, rule.tool, ids
                    )
                result = store.scripts.run(
                    "remember", keys, **values, **({"run_id": run_id} if run_id else {})
                )
                if result[0] == "need_stream":
                    extra.append(result[1])
                elif result[0] == "need_run":
                    run_id = result[1]
                elif result[0] == "rule_exists":
                    raise RuleExists(f"remember.id: rule {rule.id!r} already exists")
                else:
                    if clustered and result[0] == "ok":
                        self.rules.activate(rule)
                        active = True
                    request = self.broker.decisions._outcome(result, current.id, decision)
                    if clustered and not active:
                        self.rules.activate(rule)
                        active = True
                    decided = tuple(
                        r.id
                        for r in self.broker.get_requests(s.id for s in siblings)
                        if r.decision is not None and r.decision.rule == rule.id
                    )
                    if clustered and decided:
                        self.rules.count_hits([verdict] * len(decided))
                    stored = self.rules.get(rule.id)
                    return Remembered(request, recorded=True, rule=stored, siblings=decided)
            raise RuntimeError(f"remember of {current.id} kept asking for more keys: {result!r}")
        finally:
            if clustered and not active:
                self.rules.discard(rule)  # not decided: nor remembered, as on one Redis
