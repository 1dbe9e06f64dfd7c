"""Rules in Redis: one hash per rule, a SET of rule ids per exact tool name and one for glob
tools, a listing ZSET, and a version counter bumped by every change.

Matching reads only the rules indexed for the call's tool plus the glob rules, parsed once per
version and bucketed by run and agent, so a create costs one GET when nothing changed. This
module never decides a request; the create step does, re-checking the chosen rule atomically.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any

from redis import Redis
from redis.exceptions import WatchError

from broker.audit.trail import append_entry
from broker.domain.config import Config
from broker.domain.errors import InvalidInput, NotFound
from broker.domain.rules.matching import Call, evaluate, in_queue
from broker.domain.rules.models import CONFIG_CREATOR, Effect, Rule, RuleBody, is_glob
from broker.store.keys import Keys
from broker.store.rule_records import RuleKeys, epoch, from_fields, new_rule_id, to_fields

_UNREAD = object()  # the rules' version was not read by the caller


class RuleExists(InvalidInput):
    code = "rule_exists"


@dataclass
class _Bucket:
    """One tool's (or the glob rules') rules, by the scope that narrows them most."""

    by_run: dict[str, list[Rule]] = field(default_factory=dict)
    by_agent: dict[str, list[Rule]] = field(default_factory=dict)
    rest: list[Rule] = field(default_factory=list)
    every: list[Rule] = field(default_factory=list)

    @classmethod
    def of(cls, rules: Iterable[Rule]) -> _Bucket:
        bucket = cls()
        for rule in rules:
            bucket.every.append(rule)
            if rule.run_id is not None:
                bucket.by_run.setdefault(rule.run_id, []).append(rule)
            elif rule.agent is not None:
                bucket.by_agent.setdefault(rule.agent, []).append(rule)
            else:
                bucket.rest.append(rule)
        return bucket

    def relevant(self, call: Call) -> list[Rule]:
        found = list(self.rest)
        if call.run_id is not None:
            found += self.by_run.get(call.run_id, ())
        if call.agent is not None:
            found += self.by_agent.get(call.agent, ())
        return found


@dataclass
class _Cache:
    version: bytes | None
    tools: dict[str, _Bucket] = field(default_factory=dict)
    globs: _Bucket | None = None
    globs_for: dict[str, _Bucket] = field(default_factory=dict)  # tool name -> globs covering it


class RuleStore:
    """Create, read, list and revoke rules; find the candidates for a call, cached per version."""

    def __init__(
        self,
        redis: Redis,
        config: Config,
        *,
        prefix: str = "ab:",
        clock: Callable[[], float] = time.time,
        keys: RuleKeys | None = None,
    ) -> None:
        self.redis = redis
        self.config = config
        self.keys = keys or RuleKeys(prefix)  # `Keys.rules`: one hash tag of their own on a cluster
        self.agent_keys = Keys(prefix)
        self.clock = clock
        self._lock = threading.Lock()
        self._cache = _Cache(_UNREAD)  # type: ignore[arg-type]

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

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
        revoked = rule.model_copy(update={"revoked_at": self.now()})
        own = pipe is None
        pipe = pipe if pipe is not None else self.redis.pipeline(transaction=True)
        # HSETNX: of two revokes racing, the first time stands.
        pipe.hsetnx(self.keys.rule(rule.id), "revoked_at", epoch(revoked.revoked_at))  # type: ignore[arg-type]
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

    # --- reading -------------------------------------------------------------------------

    def get(self, rule_id: str) -> Rule:
        raw = self.redis.hgetall(self.keys.rule(rule_id))
        if not raw:
            raise NotFound(f"no rule {rule_id!r}")
        return from_fields(raw)

    def get_many(self, ids: Iterable[str | bytes]) -> list[Rule]:
        pipe = self.redis.pipeline(transaction=False)
        for rule_id in ids:
            pipe.hgetall(
                self.keys.rule(rule_id.decode() if isinstance(rule_id, bytes) else rule_id)
            )
        return [from_fields(raw) for raw in pipe.execute() if raw]

    def list(
        self,
        *,
        agent: str | None = None,
        run_id: str | None = None,
        tool: str | None = None,
        active: bool | None = None,
        limit: int = 1000,
    ) -> list[Rule]:
        """Rules newest first. `tool` keeps the rules that apply to that tool name (globs too)."""
        now = self.now()
        found: list[Rule] = []
        start, page = 0, 500
        while len(found) < limit:
            ids = self.redis.zrevrange(self.keys.listing, start, start + page - 1)
            if not ids:
                break
            start += page
            for rule in self.get_many(ids):
                if agent is not None and rule.agent != agent:
                    continue
                if run_id is not None and rule.run_id != run_id:
                    continue
                if tool is not None and not matches_tool(rule, tool):
                    continue
                if active is not None and rule.is_active(now) != active:
                    continue
                found.append(rule)
        return found[:limit]

    # --- matching ------------------------------------------------------------------------

    def read_version(self) -> bytes | None:
        """The rules' version now (one GET)."""
        return self.redis.get(self.keys.version)

    def known_version(self) -> bytes | None:
        """The version of the cached rule set, read only if none is cached yet: for a step
        that checks it itself (create.lua), so the rules cost no round trip while unchanged."""
        version = self._cache.version
        if version is _UNREAD:
            return self.read_version()
        return version  # type: ignore[return-value]

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

    def _fresh(self, version: bytes | None | object = _UNREAD) -> _Cache:
        """The parsed rules of the current version; a new, empty cache if any rule changed.

        One GET when nothing changed (none when the caller read `version` already, in a pipeline
        of its own). Rules are read only after the version, so a cache never holds rules older
        than its version; a load finishing late fills a cache already dropped.
        """
        if version is _UNREAD:
            version = self.redis.get(self.keys.version)
        with self._lock:
            if self._cache.version != version:
                self._cache = _Cache(version)
            return self._cache

    def _load(self, index_key: str) -> _Bucket:
        ids = self.redis.smembers(index_key)
        now = self.now()
        rules = [r for r in self.get_many(ids) if r.revoked_at is None]
        expired = [r.id for r in rules if not r.is_active(now)]
        if expired:  # an expired rule never matches again: keep the index small
            self.redis.srem(index_key, *expired)
        return _Bucket.of(r for r in rules if r.is_active(now))

    def _buckets(
        self, tool_name: str, version: bytes | None | object = _UNREAD
    ) -> tuple[_Bucket, _Bucket]:
        """This tool's rules and the glob rules that cover its name, both bucketed by scope."""
        cache = self._fresh(version)
        bucket = cache.tools.get(tool_name)
        if bucket is None:
            bucket = cache.tools[tool_name] = self._load(self.keys.by_tool(tool_name))
        globs = cache.globs_for.get(tool_name)
        if globs is None:
            if cache.globs is None:
                cache.globs = self._load(self.keys.globs)
            covering = (r for r in cache.globs.every if matches_tool(r, tool_name))
            globs = cache.globs_for[tool_name] = _Bucket.of(covering)
        return bucket, globs

    def may_cover(self, tool_name: str, version: bytes | None | object = _UNREAD) -> bool:
        """Whether any rule of `version` may cover a call of this tool: False means `match`
        finds nothing for it, so a bulk create need not build the call (same buckets)."""
        bucket, globs = self._buckets(tool_name, version)
        return bool(bucket.every or globs.every)

    def candidates(self, tool_name: str) -> list[Rule]:
        """Every unrevoked, unexpired rule that may cover a call of this tool."""
        bucket, globs = self._buckets(tool_name)
        return bucket.every + globs.every

    def match(
        self,
        call: Call,
        now: datetime | None = None,
        *,
        exclude: Collection[str] = (),
        quorum: int = 1,
        version: bytes | None | object = _UNREAD,
    ) -> tuple[Effect, Rule] | None:
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
        version: bytes | None | object = _UNREAD,
    ) -> tuple[Effect, Rule] | None:
        """The shadow rule that would decide this call were it enforced (deny beats allow, as
        for `match`), or None. It decides nothing: the caller records it (`shadow_rule`)."""
        if call.kind != "approval":
            return None
        call = in_queue(call, self.config)
        bucket, globs = self._buckets(call.tool_name, version)
        found = [
            r
            for r in bucket.relevant(call) + globs.relevant(call)
            if r.mode == "shadow" and may_bypass(r, quorum)
        ]
        return evaluate(found, call, now or self.now())

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


def matches_tool(rule: Rule, tool_name: str) -> bool:
    return rule.tool == tool_name or (is_glob(rule.tool) and fnmatchcase(tool_name, rule.tool))


def active_match(store: RuleStore, call: Call) -> tuple[Effect, Rule] | None:
    """Match, then re-check and count the chosen rule; re-match if it changed meanwhile."""
    for _ in range(5):
        found = store.match(call)
        if found is None or store.hit(found[1].id):
            return found
    return None
