"""A decision that keeps a rule, written: the decision, the rule and the siblings it decides.

remember.lua writes the person's decision, the new rule and the decision of each pending
sibling of the run the rule covers in one step, so the round resumes exactly once (finish()
writes the resume with the last outcome). On a Redis Cluster the rules live in a slot of their
own: the rule is stored first, matching nothing (`indexed=False`), the step decides, then the
rule is activated, or taken back if the decision did not happen.

What the rule is, whether its decider may keep it and which siblings it covers is the judge's
(`broker.judge.rule_decisions`): this module writes what it is given and reads what it asks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis.cluster import RedisCluster

from broker.audit.actors import actor_args
from broker.domain.ids import run_of_request
from broker.domain.models import HistoryEntry, Request, utcnow
from broker.domain.receipts import call_facts
from broker.domain.rule_decided import verdict_for
from broker.domain.rules.models import Rule
from broker.redis.replies import as_str
from broker.store.decide_step import OUTCOME_STATUS, Step, outcome_of
from broker.store.handles import Store
from broker.store.requests import Requests
from broker.store.rule_records import to_fields
from broker.store.rule_store import RuleExists

_TRIES = 5


@dataclass(frozen=True)
class Kept:
    """What a remember step wrote: the request as recorded, the rule as stored, and the
    siblings the rule decided in the same step."""

    request: Request
    rule: Rule
    siblings: tuple[str, ...]


class Remembering:
    """The remember step, and the reads the judge makes before it."""

    def __init__(self, store: Store, requests: Requests) -> None:
        self.store = store
        self.requests = requests

    def run_pending(self, request: Request) -> tuple[str | None, list[Request]]:
        """The agent of the request's run and the run's other pending requests."""
        if not request.run_id:
            return None, []
        keys, redis = self.store.keys, self.store.redis
        ids = [as_str(i) for i in redis.smembers(keys.run_pending(request.run_id))]
        agent = redis.hget(keys.run(request.run_id), "agent")
        others = sorted(i for i in ids if i != request.id)
        return (as_str(agent) if agent else None), self.requests.get_requests(others)

    def remember(self, step: Step, rule: Rule, siblings: list[Request]) -> Kept:
        """Record `step` (an approval or rejection, its request read) and keep `rule`; decide
        each of `siblings` by the rule. Raises what a decide step raises, or `RuleExists`."""
        store = self.store
        rules = self.requests.rules
        current = step.request
        if current is None:
            raise ValueError("a remember step needs the request read")
        decision = step.decision
        recorded = decision.model_copy(update={"decided_by": step.decided_by, "decided_at": None})
        receipts = store.receipts
        if receipts is not None:  # the person's decision, and each sibling the rule decides
            recorded = receipts.stamp(call_facts(current), recorded, decided_by=step.decided_by)
        entry = HistoryEntry(at=utcnow(), event="rule_created", by=step.decided_by, rule=rule.id)
        entry_data = entry.model_dump(mode="json", exclude_none=True)
        entry_data.pop("at")
        verdict = verdict_for(rule)
        sibling_verdicts = [verdict.receipted(receipts, call_facts(s)) for s in siblings]
        fields = {k: v for k, v in to_fields(rule).items() if k != "created_at"}
        once_key, once_ttl = step.once if step.once else (None, None)
        run_id = run_of_request(current.id)
        extra: list[str] = []
        values: dict[str, Any] = {
            "id": current.id,
            "outcome": decision.outcome.value,
            "status": OUTCOME_STATUS[decision.outcome].value,
            "decision": json.dumps(recorded.public(), separators=(",", ":"), ensure_ascii=False),
            "in_queue": step.in_queue,
            "in_escalation": step.in_escalation,
            "voter": step.voter or step.decided_by,
            "entry": json.dumps(entry_data, separators=(",", ":")),
            "rule": {"id": rule.id, "effect": rule.effect, "fields": fields},
            "siblings": [
                {"id": s.id, "decision": v.decision_json(), "entry": v.entry_json()}
                for s, v in zip(siblings, sibling_verdicts, strict=True)
            ],
            "sibling_status": verdict.status.value,
            **actor_args(step.decided_by),
            "maxlen": store.maxlen,
            "retention": store.retention,
        }
        if decision.args_hash:
            values["args_hash"] = decision.args_hash
        if step.creator_may_vote:  # the admin and the shell, as for a decision
            values["creator_may_vote"] = True
        if once_key:
            values["once_ttl"] = once_ttl
        clustered = isinstance(store.redis, RedisCluster)
        if clustered:
            # The rules' slot is not the request's: the rule first, in a step of its own, but
            # matching nothing until the decision happened (`activate`), so a remember that
            # loses never decides another request; taken back on any failure.
            rules.insert(rule, where="remember.id", indexed=False)
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
                        rules.activate(rule)
                        active = True
                    request = outcome_of(result, current.id, decision)
                    if clustered and not active:
                        rules.activate(rule)
                        active = True
                    decided = tuple(
                        r.id
                        for r in self.requests.get_requests(s.id for s in siblings)
                        if r.decision is not None and r.decision.rule == rule.id
                    )
                    if clustered and decided:
                        rules.count_hits([verdict] * len(decided))
                    return Kept(request, rules.get(rule.id), decided)
            raise RuntimeError(f"remember of {current.id} kept asking for more keys: {result!r}")
        finally:
            if clustered and not active:
                rules.discard(rule)  # not decided: nor remembered, as on one Redis
