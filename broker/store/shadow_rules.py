"""Recording what a shadow rule would have decided: `shadow_rule` in the request's history
and the audit trail, and the event `approval.shadow_rule` on its queue's stream (one note step,
note.lua), and a metric.

A rule with `mode = "shadow"` decides nothing (`RuleStore.match` leaves it out); the create
step's caller finds, per new approval request, the shadow rule that would have decided it
(`RuleStore.shadow_match`) and hands the matches here once the requests exist. Nothing here
decides a request.
"""

from __future__ import annotations

import json

from broker.audit.actors import actor_args
from broker.domain.models import utcnow
from broker.domain.rules.models import Rule
from broker.store.handles import Store
from broker.store.rule_store import RuleStore

EVENT = "shadow_rule"
STREAM_EVENT = "approval.shadow_rule"
"""On the stream of the request's queue (the SSE event stream shows it; no channel is sent it)."""


class ShadowRecorder:
    def __init__(self, store: Store, rules: RuleStore) -> None:
        self.store = store
        self.rules = rules

    def record(self, shadows: dict[str, Rule], details: dict[str, str] | None = None) -> None:
        """For each new request id a shadow rule would have decided (or routed): a history entry
        `{"event": "shadow_rule", "rule": ID, "detail": "would allow"}` (a route's detail
        says where: `details`, e.g. "would route to finance (quorum 2, risk high)") and an
        audit entry (event `shadow_rule`, actor `rule:ID`, outcome the effect) in one step,
        then the count."""
        store = self.store
        pipe = store.redis.pipeline(transaction=False)
        for request_id, rule in shadows.items():
            entry = {
                "at": utcnow().isoformat().replace("+00:00", "Z"),
                "event": EVENT,
                "by": f"rule:{rule.id}",
                "rule": rule.id,
                "detail": (details or {}).get(request_id) or f"would {rule.effect}",
            }
            store.scripts.run(
                "note",
                store.keys.shadow_keys(request_id, store.config.queues),
                client=pipe,
                entry=json.dumps(entry, separators=(",", ":")),
                emit=STREAM_EVENT,
                maxlen=store.maxlen,
                event=EVENT,
                request_id=request_id,
                outcome=rule.effect,
                detail=rule.id,
                **actor_args(f"rule:{rule.id}"),
            )
        pipe.execute()
        self.rules.count_shadow((rule.id, rule.effect) for rule in shadows.values())
