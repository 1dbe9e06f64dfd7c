"""The Redis key schema, in one place. Every key the broker touches is named here.

Lua scripts never build a key name: each call gets its keys in KEYS, listed by the builders of
`broker.store.script_keys` (part of `Keys`). On a Redis Cluster each name carries its partition's hash
tag (`broker.store.partitions`). Keys added by other branches arrive at the end of this file, each
block headed `# --- added by <branch>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.store.partitions import Partitioned
from broker.store.script_keys import StepKeys

NOTIFIER_GROUP = "notifiers"
GLOB_CHARS = frozenset("*?[")
RESUMER_GROUP = "resumers"


@dataclass(frozen=True)
class Keys(Partitioned, StepKeys):
    """Key names. With `partitions` > 1 (Redis Cluster) every key carries a hash tag
    `{PREFIXpN}`: a request's and its run's keys are in the partition of the run (or of the
    request, without a run), beside that partition's indexes, streams, outbox and counts, so
    each Lua step touches one slot. `at` is the partition the shared keys below are named in
    (`part(n)` gives the view of another); with one partition the tag is empty and every name
    is as it always was. `audit_keep_s` is how long the audit trail keeps entries; 0: the steps
    get no audit keys and write no entry (`[audit] enabled = false`)."""

    audit_keep_s: int = 0

    @property
    def audit(self) -> str:
        """Stream: this partition's audit chain, each entry hash-linked to the one before
        (`broker.audit`); trimmed by age (`[audit] retention_days`). Its `prev` and `hash` are
        in `audit:seals` (a stream, same ids), written by `broker.audit.sealing`."""
        return f"{self.base()}audit"

    @property
    def audit_head(self) -> str:
        """Hash: the last `seq` of this partition's audit chain, so that trimming the stream
        never restarts the chain, and its sealed point (`sealed` seq, `sealed_id`, `hash`)."""
        return f"{self.base()}audit:head"

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

    # ---- listing indexes (kept by the Lua steps; see docs/internals.md "Redis keys") -------

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
    def resumes_direct(self) -> str:
        """Stream: the outbox of rounds whose deciding API process enqueues the resume itself
        right after its step (`broker.runs.direct_resume`) and then deletes the entry; the
        resumers take what is left there after a grace (`broker.runs.outbox`)."""
        return f"{self.base()}resumes:direct"

    @property
    def dead_letters(self) -> str:
        """Stream: deliveries or entries that could not be handled, with their error."""
        return f"{self.prefix}dead-letters"

    @property
    def run_events(self) -> str:
        """Stream: this partition's runs that paused or ended (`run_id`, `status`), read by the
        API's long-polls on runs (`GET /v1/runs/{id}?wait=`); trimmed to about 10,000 entries."""
        return f"{self.base()}run-events"

    def run_events_of(self, run_id: str) -> str:
        """`run_events` of the partition `run_id` lives in."""
        return f"{self._run(run_id)}run-events"

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
        """String: the message history of a run paused before the run log existed (read once,
        when such a run resumes; `run_log` holds it from then on)."""
        return f"{self._run(run_id)}run:{run_id}:messages"

    def run_log(self, run_id: str) -> str:
        """List: the run's message history (pydantic-ai JSON), one entry per step that wrote
        some, each a JSON array of the messages that step added (`broker.store.run_state`)."""
        return f"{self._run(run_id)}run:{run_id}:log"

    def delivery(self, request_id: str) -> str:
        """Hash: per-channel delivery state of a request (posted Slack message, etc.)."""
        return f"{self._req(request_id)}delivery:{request_id}"

    def seen(self, namespace: str, ident: str) -> str:
        """String with TTL: a one-time marker (replayed webhook ids, used email links)."""
        return f"{self.prefix}seen:{namespace}:{ident}"

    def reason_prompt(self, platform: str, ident: str) -> str:
        """String with TTL: a reject waiting for its reason (Telegram's ForceReply prompt
        `{chat}:{message}`): JSON of the request id and the user who clicked Reject."""
        return f"{self.prefix}prompt:{platform}:{ident}"

    def receipt_spent(self, request_id: str, jti_digest: str) -> str:
        """String with TTL: a receipt's jti, spent as its tool started (beside its request)."""
        return f"{self._req(request_id)}spent:{jti_digest}"

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

    def insights(self, day: int) -> str:
        """Hash: the insights rollup of one UTC day (days since the epoch), kept by the Lua
        steps (lib.lua `rollup`): counters by kind and cell (docs/insights.md); expires
        `INSIGHTS_KEEP_S` after its last write."""
        return f"{self.base()}ins:{day}"

    def insights_hours(self, day: int) -> str:
        """Hash: the same counters as `insights(day)`, each field headed by its hour (`HH`)."""
        return f"{self.base()}ins:{day}:h"

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

    @property
    def rules(self) -> RuleKeys:
        """The policy rules' keys (`broker.store.rule_store`); on a cluster under one tag of their own."""
        return RuleKeys(self.prefix if self.partitions <= 1 else "{" + self.prefix + "rules}:")


@dataclass(frozen=True)
class RuleKeys:
    """The policy rules' key names (see `broker.store.rule_store`)."""

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

    @property
    def audit(self) -> str:
        """Stream: the audit chain of rule changes. On a single Redis it is the one chain
        (`Keys.audit`); on a cluster the rules' slot has a chain of its own."""
        return f"{self.prefix}audit"

    @property
    def audit_head(self) -> str:
        """Hash: the last `seq` and the sealed point of that chain (`Keys.audit_head`)."""
        return f"{self.prefix}audit:head"

    def index(self, tool: str) -> str:
        return self.globs if any(c in GLOB_CHARS for c in tool) else self.by_tool(tool)
