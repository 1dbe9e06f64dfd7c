"""The KEYS each Lua step gets: `ScriptKeys` (one call's keys by role) and the builders.

A script never spells a key: its call lists every key it touches in KEYS and tells it, in the
one JSON argument, at which position each role is (see `ScriptKeys.args`). The builders are
`StepKeys`, a part of `broker.store.keys.Keys`: they list the names `Keys` gives (`KeyNames`), grouped so that each
step touches one partition (`broker.store.partitions`). This module never invents a key name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any, Protocol, Self

import orjson

from broker.domain.models import Status

DONE_STATUSES = tuple(s.value for s in Status if s is not Status.pending)
"""The final statuses, each with its listing indexes (`done`, `done_in`)."""

DAY_S = 86400
INSIGHTS_KEEP_S = 400 * DAY_S
"""How long a day's insights rollups are kept after their last write: a year's window, and then some."""
SKEW_S = 3600
"""How far Redis's clock may be from the caller's before a step's figures land in the nearest
day it was given (lib.lua `ins_keys`) rather than its own."""


def insight_days(now: float | None = None) -> tuple[int, ...]:
    """The UTC days (since the epoch) whose rollups a step gets: today by the caller's clock,
    and the day next to it within `SKEW_S` of midnight (the step counts on Redis's clock)."""
    at = time.time() if now is None else now
    days = {int((at - SKEW_S) // DAY_S), int(at // DAY_S), int((at + SKEW_S) // DAY_S)}
    return tuple(sorted(days))


class ScriptKeys:
    """The KEYS of one script call, each under a role name the script looks it up by.

    `args(...)` is the call's one JSON argument: the caller's values plus `k` (role -> position
    in KEYS), `streams` (queue -> position) and, for steps on many requests, `r` (request id ->
    role -> position), so the script never spells a key.
    """

    def __init__(self, partition: int = 0) -> None:
        self.partition = partition  # of the shared keys named here (`Keys.at`)
        self.keys: list[str] = []
        self.roles: dict[str, int] = {}
        self.streams: dict[str, int] = {}
        self.per_request: dict[str, dict[str, int]] = {}
        self._positions: dict[str, int] = {}
        self.audit_keep: int = 0  # seconds the audit chain keeps entries (with role `audit`)
        self.insights_keep: int = 0  # seconds a day's insights rollups are kept (roles `ins:D`)

    def _position(self, key: str) -> int:
        """1-based, as Lua counts; a key named twice is passed once."""
        if key not in self._positions:
            self.keys.append(key)
            self._positions[key] = len(self.keys)
        return self._positions[key]

    def name(self, role: str, key: str) -> ScriptKeys:
        self.roles[role] = self._position(key)
        return self

    def stream(self, queue: str, key: str) -> ScriptKeys:
        self.streams[queue] = self._position(key)
        return self

    def of_request(self, request_id: str, role: str, key: str) -> ScriptKeys:
        self.per_request.setdefault(request_id, {})[role] = self._position(key)
        return self

    def audit(self, stream: str, head: str, keep_s: int) -> ScriptKeys:
        """The audit chain a step appends to (roles `audit`, `audit_head`; lib.lua's audit())."""
        self.name("audit", stream).name("audit_head", head)
        self.audit_keep = keep_s
        return self

    def insights(self, names: KeyNames, days: Iterable[int]) -> ScriptKeys:
        """The insights rollups a step adds to (roles `ins:DAY` and `insh:DAY`; lib.lua's
        `rollup` picks the day of Redis's clock among them)."""
        for day in days:
            self.name(f"ins:{day}", names.insights(day))
            self.name(f"insh:{day}", names.insights_hours(day))
        self.insights_keep = INSIGHTS_KEEP_S
        return self

    def args(self, **values: Any) -> str:
        if self.audit_keep:
            values["audit_keep"] = self.audit_keep
        if self.insights_keep:
            values["ins_keep"] = self.insights_keep
        return encode_args(
            {**values, "k": self.roles, "streams": self.streams, "r": self.per_request}
        )


def encode_args(values: dict[str, Any]) -> str:
    """A step's arguments as JSON, with orjson (the stdlib's encoder was a thirtieth of a busy
    API's CPU, in every decide step); what orjson refuses (a lone surrogate) as before, with
    the stdlib's, so the step answers it as it always did."""
    try:
        return orjson.dumps(values, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(values, ensure_ascii=False, separators=(",", ":"))


class RuleNames(Protocol):
    """The policy rules' names a builder lists, as `broker.store.keys.RuleKeys` gives them."""

    def rule(self, rule_id: str) -> str: ...
    def index(self, tool: str) -> str: ...
    @property
    def listing(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def hits(self) -> str: ...


class KeyNames(Protocol):
    """The names a builder lists, as `broker.store.keys.Keys` gives them.

    Why a protocol rather than `Keys` itself: `Keys` is built from `StepKeys`, so naming it here
    would make the two modules import each other. This lists what the builders read, nothing more.
    """

    @property
    def at(self) -> int: ...
    @property
    def partitions(self) -> int: ...
    @property
    def audit_keep_s(self) -> int: ...
    @property
    def audit(self) -> str: ...
    @property
    def audit_head(self) -> str: ...
    @property
    def expiry(self) -> str: ...
    @property
    def requests(self) -> str: ...
    @property
    def counts(self) -> str: ...
    @property
    def resumes(self) -> str: ...
    @property
    def resumes_direct(self) -> str: ...
    @property
    def rules(self) -> RuleNames: ...
    def part(self, partition: int) -> Self: ...
    def of_request(self, request_id: str) -> Self: ...
    def partition_of_request(self, request_id: str) -> int: ...
    def in_partition(self, key: str, partition: int) -> str: ...
    def request(self, request_id: str) -> str: ...
    def run(self, run_id: str) -> str: ...
    def run_pending(self, run_id: str) -> str: ...
    def run_requests(self, run_id: str) -> str: ...
    def run_round(self, run_id: str, round_no: int) -> str: ...
    def run_events_of(self, run_id: str) -> str: ...
    def by_creator(self, name: str) -> str: ...
    def receipt_spent(self, request_id: str, jti_digest: str) -> str: ...
    def done(self, status: str) -> str: ...
    def done_in(self, status: str, queue: str) -> str: ...
    def stream(self, queue: str) -> str: ...
    def pending_in(self, queue: str) -> str: ...
    def in_queue(self, queue: str) -> str: ...
    def insights(self, day: int) -> str: ...
    def insights_hours(self, day: int) -> str: ...
    def decide_keys(
        self, request_id: str, run_id: str | None, queues: Iterable[str], once_key: str | None
    ) -> ScriptKeys: ...
    def note_keys(self, request_id: str) -> ScriptKeys: ...
    def _shared(self, queues: Iterable[str]) -> ScriptKeys: ...


class StepKeys:
    """The KEYS of each Lua step, built from the names of the `Keys` this is part of."""

    def remember_keys(
        self: KeyNames,
        request_id: str,
        run_id: str | None,
        queues: Iterable[str],
        once_key: str | None,
        rule_id: str,
        tool: str,
        siblings: Iterable[str],
    ) -> ScriptKeys:
        """remember.lua: what decide.lua gets, plus the new rule's hash, its tool index, the
        rule listing and version, and the hash of each pending sibling the rule covers."""
        keys = self.decide_keys(request_id, run_id, queues, once_key)
        rules = self.rules
        keys.name("rule", rules.rule(rule_id)).name("rule_index", rules.index(tool))
        keys.name("rule_listing", rules.listing).name("rule_version", rules.version)
        keys.name("rule_hits", rules.hits)
        for sid in siblings:
            keys.of_request(sid, "req", self.request(sid))
        return keys

    def decide_keys(
        self: KeyNames,
        request_id: str,
        run_id: str | None,
        queues: Iterable[str],
        once_key: str | None,
    ) -> ScriptKeys:
        """decide.lua and escalate.lua: the request's hash, its one-time marker, its run's hash
        and pending set (when it belongs to a run), the shared indexes and queue streams."""
        part = self.partition_of_request(request_id)
        keys = self.part(part)._shared(queues)
        keys.name("req", self.request(request_id))
        if once_key:
            keys.name("once", self.in_partition(once_key, part))
        if run_id:
            keys.name("run", self.run(run_id))
            keys.name("pending", self.run_pending(run_id))
            keys.name("run_requests", self.run_requests(run_id))
        return keys

    def due_keys(self: KeyNames) -> ScriptKeys:
        """due.lua: the two request indexes."""
        return ScriptKeys().name("expiry", self.expiry).name("requests", self.requests)

    def sweep_keys(
        self: KeyNames, items: Iterable[tuple[str, str | None]], queues: Iterable[str]
    ) -> ScriptKeys:
        """sweep.lua: the shared indexes and queue streams, then for each due (request id, run id)
        the request's hash and its run's hash and pending set (roles `req`, `run`, `pending` of
        that request). The items must share one partition, `at` (`Sweeping` reads each
        partition's due index on its own)."""
        keys = self._shared(queues)
        for rid, run_id in items:
            keys.of_request(rid, "req", self.request(rid))
            if run_id:
                keys.of_request(rid, "run", self.run(run_id))
                keys.of_request(rid, "pending", self.run_pending(run_id))
                keys.of_request(rid, "run_requests", self.run_requests(run_id))
        return keys

    def ack_keys(self: KeyNames, request_id: str) -> ScriptKeys:
        """ack.lua: the request's hash and the expiry index."""
        mine = self.of_request(request_id)
        return ScriptKeys().name("req", self.request(request_id)).name("expiry", mine.expiry)

    def note_keys(self: KeyNames, request_id: str) -> ScriptKeys:
        """note.lua: the request's hash."""
        return ScriptKeys().name("req", self.request(request_id))

    def receipt_keys(
        self: KeyNames, request_id: str, queue: str, jti_digest: str, run_id: str | None
    ) -> ScriptKeys:
        """receipt.lua: the request's hash, its jti marker, its partition's counts and its
        queue's stream, and the hash of the run whose tool step it counts (if any)."""
        mine = self.of_request(request_id)
        keys = ScriptKeys(mine.at).name("req", self.request(request_id))
        keys.name("spent", self.receipt_spent(request_id, jti_digest))
        keys.name("counts", mine.counts).stream(queue, mine.stream(queue))
        if run_id:
            keys.name("run", self.run(run_id))
        if self.audit_keep_s:
            keys.audit(mine.audit, mine.audit_head, self.audit_keep_s)
        return keys

    def shadow_keys(self: KeyNames, request_id: str, queues: Iterable[str] = ()) -> ScriptKeys:
        """note.lua with an audit entry (a shadow rule's match, a delivery): the request's hash
        and its partition's audit chain, and the partition's streams of `queues` (a shadow
        rule's match is an event on the stream of the request's queue)."""
        keys = self.note_keys(request_id)
        mine = self.of_request(request_id)
        if self.audit_keep_s:
            keys.audit(mine.audit, mine.audit_head, self.audit_keep_s)
        for queue in queues:
            keys.stream(queue, mine.stream(queue))
        return keys

    def reindex_keys(self: KeyNames, queues: Iterable[str]) -> ScriptKeys:
        """reindex.lua: the shared indexes and each queue's; the caller adds each request's
        `req`, `creator` and `run_requests`."""
        return self._shared(queues)

    def page_keys(self: KeyNames, index: str) -> ScriptKeys:
        """page.lua: the one listing index a page is read from."""
        return ScriptKeys().name("index", index)

    def _shared(self: KeyNames, queues: Iterable[str]) -> ScriptKeys:
        keys = ScriptKeys(self.at)
        keys.name("expiry", self.expiry).name("requests", self.requests)
        if self.audit_keep_s:
            keys.audit(self.audit, self.audit_head, self.audit_keep_s)
        keys.name("counts", self.counts).name("resumes", self.resumes)
        keys.insights(self, insight_days())
        for status in DONE_STATUSES:
            keys.name(f"done:{status}", self.done(status))
        for queue in queues:
            keys.stream(queue, self.stream(queue))
            keys.name(f"pending:{queue}", self.pending_in(queue))
            keys.name(f"queue:{queue}", self.in_queue(queue))
            for status in DONE_STATUSES:
                keys.name(f"done:{status}:{queue}", self.done_in(status, queue))
        return keys


def create_batch_keys(
    keys: KeyNames,
    partition: int,
    run_id: str | None,
    round_no: int,
    request_ids: Iterable[str],
    queues: Iterable[str],
    creators: Iterable[str],
    rule_ids: Iterable[str],
) -> tuple[ScriptKeys, int]:
    """create.lua: `partition`'s shared keys and the streams and indexes of `queues`, each
    creator's index (role `creator:NAME`), on a single Redis the rules' version and hit counts
    and each chosen rule's hash (role `rule:ID`; on a cluster they are in another slot), the
    run's hash, round, pending set, index and run-events stream (for a round), then the request
    hashes in order.
    Returns the keys and the KEYS position of the first request hash."""
    part = keys.part(partition)
    script = part._shared(queues)
    for name in creators:
        script.name(f"creator:{name}", part.by_creator(name))
    if keys.partitions <= 1:
        script.name("rule_version", keys.rules.version).name("rule_hits", keys.rules.hits)
        for rule_id in rule_ids:
            script.name(f"rule:{rule_id}", keys.rules.rule(rule_id))
    if run_id:
        script.name("run", keys.run(run_id)).name("round", keys.run_round(run_id, round_no))
        script.name("pending", keys.run_pending(run_id))
        script.name("run_requests", keys.run_requests(run_id))
        script.name("run_events", keys.run_events_of(run_id))
    first = len(script.keys) + 1
    for rid in request_ids:
        script.keys.append(keys.request(rid))
    return script, first
