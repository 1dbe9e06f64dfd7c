"""Rules in Redis, written and matched: create, revoke and count hits; the rule that decides a call.

Reading (by id, the listing, the per-version cache of the rules that may cover a tool) is
`broker.store.rule_reads`, which `RuleStore` extends. This module never decides a request;
the create step does, re-checking the chosen rule atomically.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from redis.exceptions import WatchError

from broker.audit.trail import append_entry
from broker.domain.errors import InvalidInput
from broker.domain.rules.matching import Call, evaluate, in_queue
from broker.domain.rules.models import CONFIG_CREATOR, Decides, Effect, Rule, RuleBody
from broker.domain.rules.routing import choose_route, route_problem
from broker.store.rule_reads import UNREAD, RuleReads, Unread, Version
from broker.store.rule_records import epoch, from_fields, new_rule_id, to_fields


class RuleExists(InvalidInput):
    code = "rule_exists"


class RuleStore(RuleReads):
    """Create, read, list and revoke rules; find the candidates for a call, cached per version."""

    # --- writing -------------------------------------------------------------------------

    def check_names(self, body: RuleBody, where: str = "") -> None:
        """Refuse a rule naming a queue or agent nothing defines (InvalidInput `invalid_rule`)."""
        at = f"{where}." if where else ""
        if body.queue is not None and body.queue not in self.config.queues:
            raise InvalidInput(
                f"{at}queue: queue {body.queue!r} is not defined", code="invalid_rule"
            )
        if body.agent is not None and not self._agent_known(body.agent):
            raise InvalidInput(
                f"{at}agent: agent {body.agent!r} is not defined", code="invalid_rule"
            )
        problem = route_problem(body, self.config.queues)
        if problem is not None:
            raise InvalidInput(f"{at}{problem}", code="invalid_rule")

    def _agent_known(self, name: str) -> bool:
        return name in self.config.agents or bool(
            self.redis.sismember(self.agent_keys.agents, name)
        )

    def create(
        self,
        body: RuleBody,
        *,
        created_by: str,
        creator_roles: list[str] | None = None,
        creator_channel: str | None = None,
        from_request: str | None = None,
    ) -> Rule:
        """Store a new rule, indexed by its tool; one transaction, so nothing half-written."""
        self.check_names(body)
        if body.expires_at is not None and body.expires_at <= self.now():
            raise InvalidInput("expires_at: is already past", code="invalid_rule")
        rule = Rule.model_validate(
            {
                **body.model_dump(),
                "id": body.id or new_rule_id(),
                "created_by": created_by,
                "created_at": self.now(),
                "from_request": from_request,
                "creator_roles": creator_roles,
                "creator_channel": creator_channel,
            }
        )
        self.insert(rule)
        return rule

    def insert(self, rule: Rule, where: str = "id", *, indexed: bool = True) -> None:
        """Store `rule` unless its id is taken (RuleExists); one transaction in the rules' slot.

        `indexed=False` stores and lists it without putting it where creates match rules (nor
        bumping the version): a cluster's remember, whose decision is a step of its own, makes
        the rule match only once that decision happened (`activate`)."""
        key = self.keys.rule(rule.id)
        with self.redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                if pipe.exists(key):
                    raise RuleExists(f"{where}: rule {rule.id!r} already exists")
                pipe.multi()
                self.write(pipe, rule, indexed=indexed)
                if indexed:
                    self.audit(pipe, "rule_created", rule, rule.created_by)
                pipe.execute()
            except WatchError:
                raise RuleExists(f"{where}: rule {rule.id!r} already exists") from None

    def activate(self, rule: Rule) -> None:
        """Let creates match a rule stored with `indexed=False`: its index entry, a new version."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(self.keys.index(rule.tool), rule.id)
        pipe.incr(self.keys.version)
        self.audit(pipe, "rule_created", rule, rule.created_by)
        pipe.execute()

    def discard(self, rule: Rule) -> None:
        """Take back a rule just inserted whose decision then did not happen (a cluster's
        remember, where the two are separate steps): gone, as if never made."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.rule(rule.id))
        pipe.srem(self.keys.index(rule.tool), rule.id)
        pipe.zrem(self.keys.listing, rule.id)
        pipe.incr(self.keys.version)
        pipe.execute()

    def write(self, pipe: Any, rule: Rule, *, indexed: bool = True) -> None:
        key = self.keys.rule(rule.id)
        pipe.delete(key)
        pipe.hset(key, mapping=to_fields(rule))
        if indexed and rule.revoked_at is None:
            pipe.sadd(self.keys.index(rule.tool), rule.id)
        pipe.zadd(self.keys.listing, {rule.id: rule.created_at.timestamp()})
        if indexed:
            pipe.incr(self.keys.version)

    def revoke(self, rule_id: str, by: str | None = None) -> Rule:
        """Mark a rule revoked (kept and listed) by `by` (for the audit trail); revoking again
        changes nothing."""
        rule = self.get(rule_id)
        if self.redis.sismember(self.keys.from_config, rule_id):
            raise InvalidInput(
                f"rule {rule_id!r} comes from the config file; remove it there", code="config_rule"
            )
        return self.mark_revoked(rule, by=by)

    def mark_revoked(self, rule: Rule, pipe: Any | None = None, by: str | None = None) -> Rule:
        if rule.revoked_at is not None:
            return rule
        revoked_at = self.now()
        revoked = rule.model_copy(update={"revoked_at": revoked_at})
        own = pipe is None
        pipe = pipe if pipe is not None else self.redis.pipeline(transaction=True)
        # HSETNX: of two revokes racing, the first time stands.
        pipe.hsetnx(self.keys.rule(rule.id), "revoked_at", epoch(revoked_at))
        pipe.srem(self.keys.index(rule.tool), rule.id)
        pipe.incr(self.keys.version)
        self.audit(pipe, "rule_revoked", rule, by)
        if own:
            pipe.hgetall(self.keys.rule(rule.id))
            return from_fields(pipe.execute()[-1])
        return revoked

    def audit(self, pipe: Any, event: str, rule: Rule, actor: str | None) -> None:
        """Append the audit entry of a rule change to the rules' chain, queued in `pipe`, the
        change's own MULTI (so in the same atomic step); its detail is the rule id, its
        outcome the effect. On a cluster a pipeline can't carry a script: the entry is then
        appended just before the change (a failed change leaves an entry naming a change that
        did not happen, never a change without an entry)."""
        trail = self.config.audit
        if not trail.enabled:
            return
        keep = int(trail.retention_days * 86400)
        shadow = " (shadow)" if getattr(rule, "mode", "enforce") == "shadow" else ""
        append_entry(
            self.redis,
            self.keys.audit,
            self.keys.audit_head,
            event=event,
            actor=actor or CONFIG_CREATOR,
            outcome=rule.effect + shadow,
            detail=rule.id,
            keep_s=keep,
            client=pipe,
        )

    def hit(self, rule_id: str) -> bool:
        """Re-check that a chosen rule is still active and count the hit, atomically.

        The stand-in for what the create step's Lua will do: WATCH the rule's hash, so a revoke
        landing between the check and the count makes this retry and see the revoke.
        """
        key = self.keys.rule(rule_id)
        while True:
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    revoked, expires = pipe.hmget(key, ["revoked_at", "expires_at"])
                    now = self.clock()
                    if not pipe.exists(key) or revoked is not None:
                        return False
                    if expires is not None and float(expires) <= now:
                        return False
                    pipe.multi()
                    pipe.hincrby(key, "hits", 1)
                    pipe.hset(key, "last_hit_at", repr(now))
                    pipe.execute()
                    return True
                except WatchError:
                    continue

    # --- matching ------------------------------------------------------------------------

    def count_hits(self, verdicts: Iterable[Any]) -> None:
        """Count the hits of rules that decided requests at create (`rule_id`, `effect` of
        each verdict), in the rules' own slot: what create.lua counts itself on a single Redis."""
        pipe = self.redis.pipeline(transaction=False)
        now = repr(self.clock())
        for verdict in verdicts:
            pipe.hincrby(self.keys.rule(verdict.rule_id), "hits", 1)
            pipe.hset(self.keys.rule(verdict.rule_id), "last_hit_at", now)
            pipe.hincrby(self.keys.hits, f"{verdict.effect}:{verdict.rule_id}", 1)
        pipe.execute()

    def match(
        self,
        call: Call,
        now: datetime | None = None,
        *,
        exclude: Collection[str] = (),
        quorum: int = 1,
        version: Version | Unread = UNREAD,
    ) -> tuple[Decides, Rule] | None:
        """The rule that decides this call (deny beats allow), or None: a person is asked.

        `exclude` leaves out rules the create step found changed; a request needing more than
        one vote (`quorum` > 1) is decided only by a rule of role `policy` with `quorum_bypass`.
        `version` is the rules' version when the caller read it already (saves a round trip).
        """
        if call.kind != "approval":
            return None
        call = in_queue(call, self.config)
        bucket, globs = self._buckets(call.tool_name, version)
        found = [
            r
            for r in bucket.relevant(call) + globs.relevant(call)
            if r.id not in exclude and may_bypass(r, quorum) and r.mode == "enforce"
        ]
        return evaluate(found, call, now or self.now())

    def shadow_match(
        self,
        call: Call,
        now: datetime | None = None,
        *,
        quorum: int = 1,
        version: Version | Unread = UNREAD,
    ) -> tuple[Effect, Rule] | None:
        """The shadow rule that would decide (deny beats allow, as for `match`) or else route
        this call were it enforced, or None. It changes nothing: the caller records it
        (`shadow_rule`)."""
        if call.kind != "approval":
            return None
        call = in_queue(call, self.config)
        bucket, globs = self._buckets(call.tool_name, version)
        found = [
            r
            for r in bucket.relevant(call) + globs.relevant(call)
            if r.mode == "shadow" and (r.effect == "route" or may_bypass(r, quorum))
        ]
        at = now or self.now()
        decided = evaluate(found, call, at)
        if decided is not None:
            return decided
        route = choose_route(found, call, at)
        return ("route", route) if route is not None else None

    def route_match(
        self,
        call: Call,
        now: datetime | None = None,
        *,
        exclude: Collection[str] = (),
        version: Version | Unread = UNREAD,
    ) -> Rule | None:
        """The enforced route rule for a call no allow or deny decides (`choose_route`: the
        highest priority, then the most specific), or None: it waits where it was asked."""
        if call.kind != "approval":
            return None
        call = in_queue(call, self.config)
        bucket, globs = self._buckets(call.tool_name, version)
        found = [
            r
            for r in bucket.relevant(call) + globs.relevant(call)
            if r.effect == "route" and r.mode == "enforce" and r.id not in exclude
        ]
        return choose_route(found, call, now or self.now()) if found else None

    def count_shadow(self, matches: Iterable[tuple[str, Effect]]) -> None:
        """Count the requests shadow rules would have decided, `shadow:EFFECT:ID` in the hits
        hash (/metrics: approval_broker_rule_shadow_matches)."""
        pipe = self.redis.pipeline(transaction=False)
        for rule_id, effect in matches:
            pipe.hincrby(self.keys.hits, f"shadow:{effect}:{rule_id}", 1)
        pipe.execute()


def may_bypass(rule: Rule, quorum: int) -> bool:
    """A rule decides a request of quorum > 1 only when made by role `policy` to do so."""
    return quorum <= 1 or (rule.quorum_bypass and rule.creator_roles is None)


def active_match(store: RuleStore, call: Call) -> tuple[Decides, Rule] | None:
    """Match, then re-check and count the chosen rule; re-match if it changed meanwhile."""
    for _ in range(5):
        found = store.match(call)
        if found is None or store.hit(found[1].id):
            return found
    return None
