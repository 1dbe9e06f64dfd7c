"""The Redis key schema, in one place. Every key the broker touches is named here.

Lua scripts never build a key name: each call gets its keys in KEYS, listed by the `*_keys`
builders below, and finds each one by a role name (see `ScriptKeys`). A script's keys come in
groups (the request's, its run's, the shared indexes and streams), so that a later step can give
each group one hash tag for Redis Cluster.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from broker.ids import run_of_request
from broker.models import Status

NOTIFIER_GROUP = "notifiers"
GLOB_CHARS = frozenset("*?[")
RESUMER_GROUP = "resumers"
DONE_STATUSES = tuple(s.value for s in Status if s is not Status.pending)
"""The final statuses, each with its listing indexes (`done`, `done_in`)."""
CLUSTER_PARTITIONS = 16
"""Partitions on a Redis Cluster (a single Redis has one, so its key names carry no tag)."""


def partition_of(owner: str, partitions: int) -> int:
    """The partition of a run (by its id) or of a standalone request (by its id)."""
    if partitions <= 1:
        return 0
    return binascii.crc_hqx(owner.encode(), 0) % partitions


@dataclass(frozen=True)
class Keys:
    """Key names. With `partitions` > 1 (Redis Cluster) every key carries a hash tag
    `{PREFIXpN}`: a request's and its run's keys are in the partition of the run (or of the
    request, without a run), beside that partition's indexes, streams, outbox and counts, so
    each Lua step touches one slot. `at` is the partition the shared keys below are named in
    (`part(n)` gives the view of another); with one partition the tag is empty and every name
    is as it always was."""

    prefix: str = "ab:"
    partitions: int = 1
    at: int = 0

    # ---- partitions (hash tags) --------------------------------------------------------

    def base(self, partition: int | None = None) -> str:
        """What every key name of `partition` (default: `at`) starts with."""
        if self.partitions <= 1:
            return self.prefix
        return "{" + f"{self.prefix}p{self.at if partition is None else partition}" + "}:"

    def part(self, partition: int) -> Keys:
        """These keys as named in `partition` (its indexes, streams, outbox, counts)."""
        return self if partition == self.at else replace(self, at=partition)

    def parts(self) -> Iterator[Keys]:
        """One view per partition, for readers that go through all of them."""
        for n in range(max(self.partitions, 1)):
            yield self.part(n)

    def partition_of_run(self, run_id: str) -> int:
        return partition_of(run_id, self.partitions)

    def partition_of_request(self, request_id: str) -> int:
        """A round's request lives with its run (`broker.ids`), a standalone one by its id."""
        return partition_of(run_of_request(request_id) or request_id, self.partitions)

    def of_request(self, request_id: str) -> Keys:
        return self.part(self.partition_of_request(request_id))

    def of_run(self, run_id: str) -> Keys:
        return self.part(self.partition_of_run(run_id))

    def _req(self, request_id: str) -> str:
        return self.base(self.partition_of_request(request_id))

    def _run(self, run_id: str) -> str:
        return self.base(self.partition_of_run(run_id))

    def in_partition(self, key: str, partition: int) -> str:
        """`key` (named by these Keys with no tag, e.g. a one-time marker) moved into
        `partition`; unchanged with one partition."""
        if self.partitions <= 1 or not key.startswith(self.prefix):
            return key
        return self.base(partition) + key.removeprefix(self.prefix)

    def request(self, request_id: str) -> str:
        """Hash: one request's fields (JSON for structured ones)."""
        return f"{self._req(request_id)}req:{request_id}"

    @property
    def expiry(self) -> str:
        """ZSET: pending request ids scored by when they expire; also the index of pending ones."""
        return f"{self.base()}expiry"

    @property
    def requests(self) -> str:
        """ZSET: request ids scored by their last change (creation or outcome), for listings."""
        return f"{self.base()}requests"

    # ---- listing indexes (kept by the Lua steps; see docs/architecture.md "Listing") ------

    def pending_in(self, queue: str) -> str:
        """ZSET: ids of the requests pending in one queue, scored by when they expire."""
        return f"{self.base()}ix:pending:{queue}"

    def done(self, status: str) -> str:
        """ZSET: ids of the requests with one final status, scored by when they got it."""
        return f"{self.base()}ix:done:{status}"

    def done_in(self, status: str, queue: str) -> str:
        """ZSET: like `done`, for the requests that got that status in one queue."""
        return f"{self.base()}ix:done:{status}:{queue}"

    def in_queue(self, queue: str) -> str:
        """ZSET: ids of a queue's requests, pending or not, scored like `requests`."""
        return f"{self.base()}ix:queue:{queue}"

    def run_requests(self, run_id: str) -> str:
        """ZSET: ids of every request of a run, scored by creation."""
        return f"{self._run(run_id)}run:{run_id}:requests"

    def by_creator(self, name: str) -> str:
        """ZSET: ids of the requests a principal created over the API, scored by creation."""
        return f"{self.base()}ix:creator:{name}"

    def stream(self, queue: str) -> str:
        """Stream: events of one handler queue, read by the notifier consumer group."""
        return f"{self.base()}stream:{queue}"

    @property
    def resumes(self) -> str:
        """Stream: the outbox of runs whose round is fully answered, read by resumers."""
        return f"{self.base()}resumes"

    @property
    def dead_letters(self) -> str:
        """Stream: deliveries or entries that could not be handled, with their error."""
        return f"{self.prefix}dead-letters"

    def run(self, run_id: str) -> str:
        """Hash: a run's status, round, agent, output or error."""
        return f"{self._run(run_id)}run:{run_id}"

    def run_pending(self, run_id: str) -> str:
        """Set: request ids of the run's current round that still wait for an outcome."""
        return f"{self._run(run_id)}run:{run_id}:pending"

    def run_round(self, run_id: str, round_no: int) -> str:
        """List: request ids created in one round of a run, in call order."""
        return f"{self._run(run_id)}run:{run_id}:round:{round_no}"

    def run_messages(self, run_id: str) -> str:
        """String: the run's message history (pydantic-ai JSON), kept to resume it."""
        return f"{self._run(run_id)}run:{run_id}:messages"

    def delivery(self, request_id: str) -> str:
        """Hash: per-channel delivery state of a request (posted Slack message, etc.)."""
        return f"{self._req(request_id)}delivery:{request_id}"

    def seen(self, namespace: str, ident: str) -> str:
        """String with TTL: a one-time marker (replayed webhook ids, used email links)."""
        return f"{self.prefix}seen:{namespace}:{ident}"

    def idempotency(self, scope: str, digest: str) -> str:
        """String with TTL: an Idempotency-Key's body hash and the id it created (`HASH|ID`)."""
        return f"{self.prefix}idem:{scope}:{digest}"

    @property
    def counts(self) -> str:
        """Hash: request counts kept by the Lua steps, `pending:QUEUE` and `STATUS:QUEUE`."""
        return f"{self.base()}counts"

    @property
    def stats(self) -> str:
        """Hash: fleet-wide counters (HINCRBY), e.g. `delivered:slack`, `failed:webhook`."""
        return f"{self.prefix}stats"

    @property
    def agents(self) -> str:
        """Set: names of agents registered at run time through the Python API."""
        return f"{self.prefix}agents"

    def agent(self, name: str) -> str:
        """String: the spec (AgentConfig JSON) of an agent registered through the Python API."""
        return f"{self.prefix}agent:{name}"

    @property
    def secret(self) -> str:
        """String: a fleet-wide random secret, created once (email link signing)."""
        return f"{self.prefix}secret"

    @property
    def disabled(self) -> str:
        """Hash: delivery channels switched off (a webhook that answered 410) -> why, as JSON."""
        return f"{self.prefix}disabled"

    def parked(self, channel: str) -> str:
        """ZSET: a channel's parked deliveries, task id -> when one may next take it (epoch s).

        A notifier working on one keeps pushing its score ahead (a lease); a dead one's lapses.
        """
        return f"{self._channel(channel)}parked:{channel}"

    def parked_tasks(self, channel: str) -> str:
        """Hash: a channel's parked deliveries, task id -> JSON (the event, attempts so far)."""
        return f"{self._channel(channel)}parked-tasks:{channel}"

    def _channel(self, channel: str) -> str:
        """A channel's parked keys share one tag of their own (one slot per channel)."""
        return (
            self.prefix if self.partitions <= 1 else "{" + f"{self.prefix}parked:{channel}" + "}:"
        )

    def demo_ledger(self, customer: str | None = None) -> str:
        """Hash: the demo refunds agent's ledger, order id -> refund JSON (one per customer)."""
        return f"{self.prefix}demo:ledger" + (f":{customer}" if customer else "")

    def demo_attempts(self, customer: str | None = None) -> str:
        """Hash: how often the demo's refund step ran, tool call id -> count."""
        return f"{self.prefix}demo:attempts" + (f":{customer}" if customer else "")

    @property
    def rules(self) -> RuleKeys:
        """The policy rules' keys (`broker.rules`); on a cluster under one tag of their own."""
        return RuleKeys(self.prefix if self.partitions <= 1 else "{" + self.prefix + "rules}:")

    # ---- the KEYS of each Lua step ---------------------------------------------------------

    def create_keys(
        self,
        run_id: str | None,
        round_no: int,
        request_ids: Iterable[str],
        queues: Iterable[str],
        rules: dict[str, str] | None = None,
    ) -> ScriptKeys:
        """create.lua: the shared indexes, the run's round (if any), each new request's hash
        (role `req` of that request), the hash of the rule chosen to decide it (role `rule`),
        and the streams of the queues they go to.

        The requests must share one partition (a run's do; `Requests` groups standalone ones),
        and the shared keys are that partition's."""
        request_ids = list(request_ids)
        owners = {self.partition_of_run(run_id)} if run_id else set()
        owners |= {self.partition_of_request(rid) for rid in request_ids}
        if len(owners) > 1:
            raise ValueError("create_keys: the requests of one step span partitions")
        partition = owners.pop() if owners else self.at
        keys = self.part(partition)._shared(queues)
        if run_id:
            keys.name("run", self.run(run_id))
            keys.name("round", self.run_round(run_id, round_no))
            keys.name("pending", self.run_pending(run_id))
            keys.name("run_requests", self.run_requests(run_id))
        for rid in request_ids:
            keys.of_request(rid, "req", self.request(rid))
        for rid, rule_id in (rules or {}).items():
            keys.of_request(rid, "rule", self.rules.rule(rule_id))
        if rules:
            keys.name("rule_hits", self.rules.hits)
        return keys

    def remember_keys(
        self,
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

    def creator_keys(self, keys: ScriptKeys, created_by: str | None) -> ScriptKeys:
        """create.lua: the creator's index (role `creator`), when the API knows who asks."""
        if created_by:
            keys.name("creator", self.part(keys.partition).by_creator(created_by))
        return keys

    def decide_keys(
        self, request_id: str, run_id: str | None, queues: Iterable[str], once_key: str | None
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

    def due_keys(self) -> ScriptKeys:
        """due.lua: the two request indexes."""
        return ScriptKeys().name("expiry", self.expiry).name("requests", self.requests)

    def sweep_keys(
        self, items: Iterable[tuple[str, str | None]], queues: Iterable[str]
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

    def ack_keys(self, request_id: str) -> ScriptKeys:
        """ack.lua: the request's hash and the expiry index."""
        mine = self.of_request(request_id)
        return ScriptKeys().name("req", self.request(request_id)).name("expiry", mine.expiry)

    def note_keys(self, request_id: str) -> ScriptKeys:
        """note.lua: the request's hash."""
        return ScriptKeys().name("req", self.request(request_id))

    def reindex_keys(self, queues: Iterable[str]) -> ScriptKeys:
        """reindex.lua: the shared indexes and each queue's; the caller adds each request's
        `req`, `creator` and `run_requests`."""
        return self._shared(queues)

    def page_keys(self, index: str) -> ScriptKeys:
        """page.lua: the one listing index a page is read from."""
        return ScriptKeys().name("index", index)

    def _shared(self, queues: Iterable[str]) -> ScriptKeys:
        keys = ScriptKeys(self.at)
        keys.name("expiry", self.expiry).name("requests", self.requests)
        keys.name("counts", self.counts).name("resumes", self.resumes)
        for status in DONE_STATUSES:
            keys.name(f"done:{status}", self.done(status))
        for queue in queues:
            keys.stream(queue, self.stream(queue))
            keys.name(f"pending:{queue}", self.pending_in(queue))
            keys.name(f"queue:{queue}", self.in_queue(queue))
            for status in DONE_STATUSES:
                keys.name(f"done:{status}:{queue}", self.done_in(status, queue))
        return keys


@dataclass(frozen=True)
class RuleKeys:
    """The policy rules' key names (see `broker.rules.store`)."""

    prefix: str = "ab:"

    def rule(self, rule_id: str) -> str:
        """Hash: one rule's fields; times as epoch seconds, args as JSON. Kept after revoke."""
        return f"{self.prefix}rule:{rule_id}"

    def by_tool(self, tool: str) -> str:
        """Set: ids of unrevoked rules whose `tool` is exactly this name."""
        return f"{self.prefix}rules:tool:{tool}"

    @property
    def globs(self) -> str:
        """Set: ids of unrevoked rules whose `tool` is a glob pattern."""
        return f"{self.prefix}rules:glob"

    @property
    def listing(self) -> str:
        """ZSET: every rule id (revoked ones too) scored by creation time."""
        return f"{self.prefix}rules"

    @property
    def from_config(self) -> str:
        """Set: ids of the rules the config file made (ever), to revoke ones it no longer has."""
        return f"{self.prefix}rules:config"

    @property
    def version(self) -> str:
        """String: incremented by every create and revoke; the in-process caches key on it."""
        return f"{self.prefix}rules:version"

    @property
    def hits(self) -> str:
        """Hash: requests decided by rules, `allow`/`deny` -> count (for /metrics)."""
        return f"{self.prefix}rules:hits"

    def index(self, tool: str) -> str:
        return self.globs if any(c in GLOB_CHARS for c in tool) else self.by_tool(tool)


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

    def args(self, **values: Any) -> str:
        return json.dumps(
            {**values, "k": self.roles, "streams": self.streams, "r": self.per_request},
            ensure_ascii=False,
            separators=(",", ":"),
        )


# --- added by create


def create_batch_keys(
    keys: Keys,
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
    run's hash, round, pending set and index (for a round), then the request hashes in order.
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
    first = len(script.keys) + 1
    for rid in request_ids:
        script.keys.append(keys.request(rid))
    return script, first
