"""Reading rules from Redis: by id, the listing, and the rules that may cover a tool, per version.

One hash per rule, a SET of rule ids per exact tool name and one for glob tools, a listing
ZSET, and a version counter bumped by every change. The rules that may cover a tool are read
only for that tool plus the glob rules, parsed once per version and bucketed by run and agent,
so a create costs one GET when nothing changed. `RuleStore` (broker.store.rule_store) adds the
writes and the matching on top; this module never writes a rule nor decides a request.
"""

from __future__ import annotations

import builtins
import enum
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase

from redis import Redis

from broker.domain.config import Config
from broker.domain.errors import NotFound
from broker.domain.rules.matching import Call
from broker.domain.rules.models import Rule, is_glob
from broker.redis.replies import as_bytes, as_members
from broker.store.keys import Keys
from broker.store.rule_records import RuleKeys, from_fields


class Unread(enum.Enum):
    """The type of UNREAD, a version the caller did not read (so `is UNREAD` narrows)."""

    UNREAD = enum.auto()


UNREAD = Unread.UNREAD  # the rules' version was not read by the caller
Version = bytes | None
"""The rules' version as read (GET `rules:version`); None before the first rule."""


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
    version: Version | Unread
    tools: dict[str, _Bucket] = field(default_factory=dict)
    globs: _Bucket | None = None
    globs_for: dict[str, _Bucket] = field(default_factory=dict)  # tool name -> globs covering it


class RuleReads:
    """Read rules by id and in the listing; the rules that may cover a tool, cached per version."""

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
        self._cache = _Cache(UNREAD)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

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
            ids = as_members(self.redis.zrevrange(self.keys.listing, start, start + page - 1))
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

    # --- the rules that may cover a tool ----------------------------------------------

    def read_version(self) -> Version:
        """The rules' version now (one GET)."""
        return as_bytes(self.redis.get(self.keys.version))

    def known_version(self) -> Version:
        """The version of the cached rule set, read only if none is cached yet: for a step
        that checks it itself (create.lua), so the rules cost no round trip while unchanged."""
        version = self._cache.version
        if version is UNREAD:
            return self.read_version()
        return version

    def _fresh(self, version: Version | Unread = UNREAD) -> _Cache:
        """The parsed rules of the current version; a new, empty cache if any rule changed.

        One GET when nothing changed (none when the caller read `version` already, in a pipeline
        of its own). Rules are read only after the version, so a cache never holds rules older
        than its version; a load finishing late fills a cache already dropped.
        """
        if version is UNREAD:
            version = self.read_version()
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
        self, tool_name: str, version: Version | Unread = UNREAD
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

    def may_cover(self, tool_name: str, version: Version | Unread = UNREAD) -> bool:
        """Whether any rule of `version` may cover a call of this tool: False means `match`
        finds nothing for it, so a bulk create need not build the call (same buckets)."""
        bucket, globs = self._buckets(tool_name, version)
        return bool(bucket.every or globs.every)

    def candidates(self, tool_name: str) -> builtins.list[Rule]:  # `list` is a method here
        """Every unrevoked, unexpired rule that may cover a call of this tool."""
        bucket, globs = self._buckets(tool_name)
        return bucket.every + globs.every


def matches_tool(rule: Rule, tool_name: str) -> bool:
    return rule.tool == tool_name or (is_glob(rule.tool) and fnmatchcase(tool_name, rule.tool))
