"""The create step's routing and figures: which route rule applies to each new approval call,
the request it makes instead, and the counts create.lua adds to the insights rollups.

Why a module of its own: `broker.store.creating` runs the step and is the hot path; routing
happens only for calls a route rule may cover, and is kept out of its way. The choice of a
route is `broker.domain.rules.routing` (pure); here the chosen route becomes a `Prepared` for
the routed queue, quorum and timeout (encoded like any request), and the step's argument for
it: the rule to re-check and count, and the history entry to write. Nothing here writes Redis.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.domain.models import HistoryEntry, NewRequest, Request
from broker.domain.rule_decided import RuleVerdict
from broker.domain.rules.models import Rule
from broker.domain.rules.routing import QueueFacts, Routed, resolve
from broker.store.create_args import Prepared
from broker.store.handles import Store
from broker.store.request_hash import encode
from broker.store.rule_reads import UNREAD, Unread, Version
from broker.store.rule_store import RuleStore


@dataclass(frozen=True)
class RouteVerdict:
    """How one route rule places one request: what it set, and the request made so."""

    routed: Routed
    new: NewRequest
    prepared: Prepared

    @property
    def rule_id(self) -> str:
        return self.routed.rule_id

    @property
    def effect(self) -> str:
        return "route"

    def lua(self) -> dict[str, Any]:
        """The `routes` item of create.lua: the rule to re-check and count, the entry to write."""
        return {"id": self.rule_id, "entry": json.dumps(self.routed.entry(), separators=(",", ":"))}

    def noted(self, request: Request, at: datetime) -> Request:
        """`request` as the step wrote it: with the route's history entry at `at`."""
        entry = HistoryEntry.model_validate({**self.routed.entry(), "at": at})
        return request.model_copy(update={"history": [*request.history, entry]})


def cell_of(new: NewRequest, p: Prepared) -> tuple[str, str, str]:
    """The insights cell of a new request: queue, allowed_roles as stored, creator."""
    return new.queue, p.encoded.named.get("allowed_roles", ""), new.created_by or ""


class CreateRouting:
    """Routes new approval calls by the enforced route rules (none where a rule decides)."""

    def __init__(self, store: Store, rules: RuleStore) -> None:
        self.store = store
        self.rules = rules
        self.facts = QueueFacts(store.config)

    def routes(
        self,
        run_id: str | None,
        round_no: int,
        ids: Sequence[str],
        news: Sequence[NewRequest],
        preps: Sequence[Prepared],
        verdicts: dict[str, RuleVerdict],
        excluded: set[str],
        version: Version | Unread = UNREAD,
    ) -> dict[str, RouteVerdict]:
        """Request id -> its route, for each approval call no allow or deny decides and a
        route rule covers (matched once per distinct call)."""
        out: dict[str, RouteVerdict] = {}
        seen: dict[int, RouteVerdict | None] = {}
        covered: dict[str, bool] = {}
        for rid, new, p in zip(ids, news, preps, strict=True):
            if not p.approval or rid in verdicts:
                continue
            if new.tool_name not in covered:
                covered[new.tool_name] = self.rules.may_cover(new.tool_name, version)
            if not covered[new.tool_name]:
                continue
            if id(p) not in seen:
                rule = self.rules.route_match(p.call, exclude=excluded, version=version)
                seen[id(p)] = self._verdict(rule, new, p, run_id, round_no) if rule else None
            found = seen[id(p)]
            if found is not None:
                out[rid] = found
        return out

    def _verdict(
        self, rule: Rule, new: NewRequest, p: Prepared, run_id: str | None, round_no: int
    ) -> RouteVerdict | None:
        routed = resolve(rule, new.queue, new.timeout_s, p.quorum, self.facts)
        if routed is None:
            return None
        moved = new.model_copy(update={"queue": routed.queue, "timeout_s": routed.timeout_s})
        agent = p.call.agent
        encoded = encode(
            moved, run_id, round_no, routed.quorum, agent,
            risk=routed.risk, on_timeout=routed.on_timeout,
        )  # fmt: skip
        made = (moved, run_id, agent, self.store.config.queue_roles(routed.queue))
        return RouteVerdict(
            routed, moved, Prepared(repr(routed.timeout_s), routed.quorum, encoded, made)
        )

    @staticmethod
    def applied(
        ids: Sequence[str],
        news: Sequence[NewRequest],
        preps: Sequence[Prepared],
        routes: dict[str, RouteVerdict],
    ) -> tuple[Sequence[NewRequest], list[Prepared]]:
        """The requests to write: each routed one as its route made it, the others as asked."""
        if not routes:
            return news, list(preps)
        out_news: list[NewRequest] = []
        out_preps: list[Prepared] = []
        for rid, new, p in zip(ids, news, preps, strict=True):
            found = routes.get(rid)
            out_news.append(found.new if found else new)
            out_preps.append(found.prepared if found else p)
        return out_news, out_preps

    @staticmethod
    def tally(
        news: Sequence[NewRequest], preps: Sequence[Prepared], agent: str | None
    ) -> list[list[Any]]:
        """The created counts of the step for the insights rollups: one row per distinct
        [queue, allowed_roles (as stored), creator, agent, tool, n] (lib.lua's ins_created)."""
        by_prep: dict[int, int] = {}
        first: dict[int, tuple[NewRequest, Prepared]] = {}
        for new, p in zip(news, preps, strict=True):
            by_prep[id(p)] = by_prep.get(id(p), 0) + 1
            first.setdefault(id(p), (new, p))
        rows: dict[tuple[str, str, str, str], int] = {}
        for key, n in by_prep.items():
            new, p = first[key]
            row = (*cell_of(new, p), new.tool_name)
            rows[row] = rows.get(row, 0) + n
        return [[q, roles, by, agent or "", tool, n] for (q, roles, by, tool), n in rows.items()]

    def describe_shadows(
        self, shadows: dict[str, Rule], ids: Sequence[str], news: Sequence[NewRequest]
    ) -> dict[str, str]:
        """For each request a shadow route would have routed: `would route to Q (quorum N...)`."""
        out: dict[str, str] = {}
        asked = dict(zip(ids, news, strict=True))
        for rid, rule in shadows.items():
            if rule.effect != "route" or rid not in asked:
                continue
            new = asked[rid]
            floor = self.facts.quorum(new.queue) if self.facts.known(new.queue) else 1
            routed = resolve(
                rule, new.queue, new.timeout_s, max(floor, new.quorum or 1), self.facts
            )
            if routed is not None:
                out[rid] = f"would route {routed.describe()}"
        return out
