"""The core's face: what apps, agent workers, notifiers, the HTTP API, the channels and the CLI call.

`Broker` holds the core's services as attributes: `requests` (create, read, list), `decisions`
(the decide step, sync and async), `remembering` (a decision that keeps a rule), `acks` ("I'm
on it"), `sweeping` (expiry), `run_store` (run records and message checkpoints), `letters`
(dead letters), `deliveries` (posted copies), `once` (one-time markers), `reason_prompts`,
`idempotency` (Idempotency-Key claims), `fleet` (health and figures), `insights` (the
rollups behind `/v1/stats`), `audit` (the trail's
chains) and `async_reads()` (the API's asyncio reads). Its methods are the ones users call
(docs/testing.md, the public API in docs/internals.md) and a few the core's runs use.
Nothing outside `broker/` imports `broker.store` or `broker.redis` or spells a Redis key (an
import-linter contract): what a role needs is a service here, or a type re-exported here (`Once`,
`UNAVAILABLE`, `RuleStore`...). Every state change is one Lua step (see `broker/store/scripts/`),
so a change either happens whole or not at all, and concurrent callers can't both win. Nothing
but delegation belongs here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from redis import Redis
from redis.exceptions import ClusterError, RedisClusterException, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.audit.trail import AuditTrail
from broker.domain.config import Config, load_config
from broker.domain.errors import InvalidInput
from broker.domain.ids import new_id
from broker.domain.models import (
    Decision,
    HistoryEntry,
    NewRequest,
    Outcome,
    Request,
    Run,
    Status,
)
from broker.domain.receipts import Receipts
from broker.domain.settings import Settings
from broker.redis.async_client import async_client
from broker.redis.cluster import clustered, connect_cluster, rq_connection
from broker.redis.connection import connect
from broker.store import streams
from broker.store.acknowledging import Acks
from broker.store.async_reads import AsyncReads, Batch
from broker.store.connection import Connection
from broker.store.dead_letters import DeadLetters
from broker.store.decide_step import Once, Step
from broker.store.decisions import Decisions
from broker.store.deliveries import DeliveryState, PostState
from broker.store.delivery_commits import CommitBatch, DeliveryCommits
from broker.store.dropped_entries import DroppedEntries
from broker.store.fleet import Fleet
from broker.store.handles import Store
from broker.store.idempotency import IdempotencyKeys
from broker.store.insights import Insights
from broker.store.keys import Keys
from broker.store.notifier_claims import NotifierClaims
from broker.store.notifier_reads import GroupMissing, NotifierReads
from broker.store.once import OnceMarkers
from broker.store.parked import ParkedDeliveries
from broker.store.reason_prompts import ReasonPrompts
from broker.store.remembering import Remembering
from broker.store.request_hash import default_prompt
from broker.store.requests import Requests
from broker.store.rule_store import RuleExists, RuleStore
from broker.store.rule_sync import sync_at_start
from broker.store.run_state import RunStore
from broker.store.scripts import Scripts
from broker.store.stored_requests import StoredRequest, StoredRequests
from broker.store.sweeping import Sweeping, SweepResult

__all__ = [
    "UNAVAILABLE",
    "AsyncReads",
    "Batch",
    "Broker",
    "CommitBatch",
    "DeliveryState",
    "GroupMissing",
    "Once",
    "PostState",
    "RuleExists",
    "RuleStore",
    "StoredRequest",
    "SweepResult",
    "default_prompt",
    "new_id",
    "sync_at_start",
]

UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterError,  # a cluster failing over: down, a master down, slots moving
    RedisClusterException,
    SlotNotCoveredError,
)
"""Redis errors that mean "not reachable now, try again": an API answers 503, never 500."""


class Broker:
    """Durable approval requests and runs on one Redis.

    `redis` must be a client *without* `decode_responses`; the broker decodes what it reads.
    """

    def __init__(self, redis: Redis, config: Config | None = None, *, prefix: str = "ab:") -> None:
        self.store = Store(redis, config or load_config(None), Keys(prefix), Scripts(redis))
        self.requests = Requests(self.store)
        # the judge's steps (`broker.judge`): a decision, a decision that keeps a rule, an ack
        self.decisions = Decisions(self.store, self.requests)
        self.remembering = Remembering(self.store, self.requests)
        self.acks = Acks(self.store)
        self.sweeping = Sweeping(self.store)
        self.run_store = RunStore(self.store)
        self.letters = DeadLetters(self.store)
        self.deliveries = DeliveryState(self.store)
        # what the API, the channels' inbound side, the CLI and the workers read and keep
        self.once = OnceMarkers(self.store)
        self.reason_prompts = ReasonPrompts(self.store)
        self.idempotency = IdempotencyKeys(self.store)
        self.fleet = Fleet(self.store)
        self.insights = Insights(self.store)  # the rollups behind GET /v1/stats
        # the notifiers' state (notifiers/ reaches Redis only through these; see each module)
        self.notifier_reads = NotifierReads(self.store)  # streams, group set-up, XREADGROUP
        self.notifier_claims = NotifierClaims(self.store)  # XAUTOCLAIM, pending, heartbeat XCLAIM
        self.stored_requests = StoredRequests(self.store, self.requests)  # what events point at
        self.parked = ParkedDeliveries(self.store)  # deliveries handed on (ZSET + hash)
        self.commits = DeliveryCommits(self.store, self.requests, self.parked)  # committer batch
        self.dropped = DroppedEntries(self.store)  # entries given up: counted and acknowledged
        self.connection = Connection(self.store)  # closed by a long-running role that stops

    @classmethod
    def from_settings(
        cls,
        settings: Settings | None = None,
        config: Config | None = None,
        *,
        patient: bool = False,
    ) -> Broker:
        """Connect as the environment says (APPROVAL_BROKER_REDIS_URL must be set).

        A `patient` broker (the background roles) rides out a Redis restart (`connect`).
        """
        settings = settings or Settings()
        if not settings.redis_url:
            raise InvalidInput("APPROVAL_BROKER_REDIS_URL is not set", code="no_redis")
        config = config or load_config(settings.config)
        if clustered(settings, config):  # the broker's keys on the cluster, RQ on its own Redis
            rq = rq_connection(None, settings.rq_redis_url, cluster=True, patient=patient)
            client = connect_cluster(settings.redis_url, patient=patient)
            broker = cls(client, config, prefix=settings.key_prefix)  # type: ignore[arg-type]  # a RedisCluster serves every command the store sends a Redis
            broker.store.rq = rq
            return broker
        return cls(connect(settings.redis_url, patient=patient), config, prefix=settings.key_prefix)

    @property
    def redis(self) -> Redis:
        return self.store.redis

    @property
    def config(self) -> Config:
        return self.store.config

    @property
    def keys(self) -> Keys:
        return self.store.keys

    @property
    def scripts(self) -> Scripts:
        return self.store.scripts

    @property
    def maxlen(self) -> int:
        return self.store.maxlen

    @property
    def retention(self) -> int:
        return self.store.retention

    @property
    def key_prefix(self) -> str:
        """What every key of this broker starts with (one fleet's, of several sharing a Redis)."""
        return self.keys.prefix

    @property
    def partitions(self) -> int:
        """How many partitions the keys are split into: 1 on a single Redis, more on a cluster."""
        return max(self.keys.partitions, 1)

    def async_reads(self, redis_url: str | None = None) -> AsyncReads:
        """A new asyncio face on this broker's Redis (by `redis_url` when given, else with the
        sync client's settings) for the API's stream and run reads. It is bound to the event
        loop it first runs on: one per loop, closed with `aclose`."""
        client = async_client(redis_url, self.redis)
        return AsyncReads(client, self.keys, self.store.scripts.coalesced)

    @property
    def rq_connection(self) -> Redis:
        """The Redis RQ runs on: the broker's own, or a single Redis beside a cluster."""
        return self.store.rq_redis

    @property
    def receipts(self) -> Receipts | None:
        """The receipt signer and checker of `[receipts]`, or None when no key is configured."""
        return self.store.receipts

    @property
    def audit(self) -> AuditTrail:
        """The audit trail's chains on this broker's Redis (read, seal, export)."""
        return AuditTrail(self.redis, self.keys)

    # ---- requests -------------------------------------------------------------------------

    def create_request(self, new: NewRequest) -> Request:
        return self.requests.create_request(new)

    def create_requests(self, news: Sequence[NewRequest]) -> list[Request]:
        return self.requests.create_requests(news)

    def create_round(
        self,
        run_id: str,
        round_no: int,
        calls: Sequence[NewRequest],
        *,
        agent: str | None = None,
    ) -> list[Request]:
        return self.requests.create_round(run_id, round_no, calls, agent=agent)

    def get_request(self, request_id: str) -> Request:
        return self.requests.get_request(request_id)

    def get_requests(self, ids: Iterable[str]) -> list[Request]:
        return self.requests.get_requests(ids)

    def list_requests(
        self, *, status: Status | str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Request]:
        return self.requests.list_requests(status=status, queue=queue, limit=limit)

    def round_requests(self, run_id: str, round_no: int) -> list[Request]:
        return self.requests.round_requests(run_id, round_no)

    def add_history(self, request_id: str, entry: HistoryEntry | str, *, pipe: Any = None) -> None:
        self.requests.add_history(request_id, entry, pipe=pipe)

    def counts(self) -> dict[str, int]:
        return self.requests.counts()

    # ---- deciding and sweeping -------------------------------------------------------------

    def decide(
        self,
        request_id: str,
        decision: Decision,
        *,
        decided_by: str,
        in_queue: str | None = None,
        once: Once | None = None,
        in_escalation: int | None = None,
        request: Request | None = None,
    ) -> Request:
        """Record `decision` as `decided_by`, as a system (or a test) does: the first decision
        wins. It is the step the judge (`broker.judge`) runs once it has said who may decide,
        without the judge: no roles, channels or persons are checked here.

        `in_queue`, `in_escalation` and `once` are the step's conditions
        (`broker.store.decide_step.Step`); `request`, the request as read, saves a read when
        a receipt is signed. Raises what the step raises (`broker.store.decisions`).
        """
        return self.decisions.decide(
            Step(
                request_id,
                decision,
                decided_by,
                in_queue=in_queue,
                in_escalation=in_escalation,
                once=once,
                request=request,
            )
        )

    def escalate(
        self,
        request_id: str,
        target: str | None = None,
        *,
        reason: str | None = None,
        decided_by: str,
        args_hash: str | None = None,
        once: Once | None = None,
        in_queue: str | None = None,
        in_escalation: int | None = None,
    ) -> Request:
        """Move a pending request to `target` (default: its queue's `escalate_to`) as
        `decided_by`: `decide` with an `escalated` decision. Its deadline there is its first
        arrival there plus that queue's timeout (see move in lib.lua)."""
        decision = Decision(
            outcome=Outcome.escalated, target=target, reason=reason, args_hash=args_hash
        )
        step = Step(
            request_id,
            decision,
            decided_by,
            in_queue=in_queue,
            in_escalation=in_escalation,
            once=once,
        )
        return self.decisions.decide(step)

    def sweep(self, *, now: float | None = None, limit: int = 200) -> list[SweepResult]:
        return self.sweeping.sweep(now=now, limit=limit)

    # ---- runs ----------------------------------------------------------------------------

    def create_run(
        self,
        agent: str,
        prompt: str,
        *,
        run_id: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> Run:
        return self.run_store.create_run(agent, prompt, run_id=run_id, extra=extra)

    def run_fields(self, run_id: str) -> dict[str, str]:
        return self.run_store.run_fields(run_id)

    def get_run(self, run_id: str) -> Run:
        return self.run_store.get_run(run_id)

    def update_run(self, run_id: str, **fields: Any) -> None:
        self.run_store.update_run(run_id, **fields)

    def save_messages(self, run_id: str, messages_json: bytes) -> None:
        self.run_store.save_messages(run_id, messages_json)

    def load_messages(self, run_id: str) -> bytes | None:
        return self.run_store.load_messages(run_id)

    # ---- the resume outbox and dead letters -----------------------------------------------

    def ensure_group(self, stream: str, group: str) -> None:
        streams.ensure_group(self.redis, stream, group)

    def dead_letter(
        self,
        source: str,
        error: str,
        *,
        stream: str | None = None,
        entry: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
    ) -> str:
        return self.letters.dead_letter(source, error, stream=stream, entry=entry, extra=extra)

    def redrive(self, entry_id: str) -> bool:
        return self.letters.redrive(entry_id)

    def dead_letters(self, count: int = 100) -> list[tuple[str, dict[str, str]]]:
        return self.letters.dead_letters(count)
