"""The client API that apps, agent workers, notifiers and the HTTP API call: a thin facade.

`Broker` keeps one method per thing a caller does and hands each to the service that owns it:
`requests` (create, read, list), `decisions` (decide, escalate), `sweeping` (expiry),
`run_store` (run records and message checkpoints), `letters` (dead letters), and the outbox's
stream helpers (`broker.store.streams`).
Every state change is one Lua step (see `broker/store/scripts/`), so a change either happens whole or
not at all, and concurrent callers can't both win. Nothing but delegation belongs here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from redis import Redis
from redis.exceptions import ClusterError, RedisClusterException, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.domain.config import Config, load_config
from broker.domain.errors import InvalidInput
from broker.domain.ids import new_id
from broker.domain.models import Decision, HistoryEntry, NewRequest, Request, Run, Status
from broker.domain.settings import Settings
from broker.redis.cluster import clustered, connect_cluster, rq_connection
from broker.redis.connection import connect
from broker.store import streams
from broker.store.connection import Connection
from broker.store.dead_letters import DeadLetters
from broker.store.decisions import Decisions, Once
from broker.store.deliveries import DeliveryState, PostState
from broker.store.delivery_commits import CommitBatch, DeliveryCommits
from broker.store.dropped_entries import DroppedEntries
from broker.store.handles import Store
from broker.store.keys import RESUMER_GROUP, Keys
from broker.store.notifier_claims import NotifierClaims
from broker.store.notifier_reads import GroupMissing, NotifierReads
from broker.store.parked import ParkedDeliveries
from broker.store.request_hash import default_prompt
from broker.store.requests import Requests
from broker.store.run_state import RunStore
from broker.store.scripts import Scripts
from broker.store.stored_requests import StoredRequest, StoredRequests
from broker.store.sweeping import SweepBatch, Sweeping, SweepResult

__all__ = [
    "UNAVAILABLE",
    "Broker",
    "CommitBatch",
    "DeliveryState",
    "GroupMissing",
    "Once",
    "PostState",
    "StoredRequest",
    "SweepResult",
    "default_prompt",
    "new_id",
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
        self.decisions = Decisions(self.store, self.requests)
        self.sweeping = Sweeping(self.store)
        self.run_store = RunStore(self.store)
        self.letters = DeadLetters(self.store)
        self.deliveries = DeliveryState(self.store)
        # the notifiers' state (notifiers/ reaches Redis only through these; see each module)
        self.notifier_reads = NotifierReads(self.store)  # streams, group set-up, XREADGROUP
        self.notifier_claims = NotifierClaims(self.store)  # XAUTOCLAIM, pending, heartbeat XCLAIM
        self.stored_requests = StoredRequests(self.store, self.requests)  # what events point at
        self.parked = ParkedDeliveries(self.store)  # deliveries handed on (ZSET + hash)
        self.commits = DeliveryCommits(self.store, self.requests, self.parked)  # committer batch
        self.dropped = DroppedEntries(self.store)  # entries given up: counted and acknowledged
        self.connection = Connection(self.store)  # ping and close, for a long-running role

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
            broker = cls(client, config, prefix=settings.key_prefix)  # type: ignore[arg-type]
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
        voter: str | None = None,
        in_escalation: int | None = None,
        channel: str | None = None,
        creator_may_vote: bool = False,
        bypass_quorum: bool = False,
        request: Request | None = None,
    ) -> Request:
        return self.decisions.decide(
            request_id,
            decision,
            decided_by=decided_by,
            voter=voter,
            in_queue=in_queue,
            in_escalation=in_escalation,
            once=once,
            channel=channel,
            creator_may_vote=creator_may_vote,
            bypass_quorum=bypass_quorum,
            request=request,
        )

    def escalate(
        self,
        request_id: str,
        target: str | None = None,
        *,
        reason: str | None = None,
        by: str,
        args_hash: str | None = None,
        once: Once | None = None,
        in_queue: str | None = None,
        in_escalation: int | None = None,
    ) -> Request:
        return self.decisions.escalate(
            request_id,
            target,
            reason=reason,
            by=by,
            args_hash=args_hash,
            in_queue=in_queue,
            in_escalation=in_escalation,
            once=once,
        )

    def sweep(self, *, now: float | None = None, limit: int = 200) -> list[SweepResult]:
        return self.sweeping.sweep(now=now, limit=limit)

    def sweep_batch(self, *, now: float | None = None, limit: int = 200) -> SweepBatch:
        return self.sweeping.sweep_batch(now=now, limit=limit)

    def next_due_in(self) -> float | None:
        return self.sweeping.next_due_in()

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

    def new_run_fields(
        self,
        agent: str,
        prompt: str,
        *,
        run_id: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> dict[str, str]:
        return self.run_store.new_run_fields(agent, prompt, run_id=run_id, extra=extra)

    def run_fields(self, run_id: str) -> dict[str, str]:
        return self.run_store.run_fields(run_id)

    def get_run(self, run_id: str) -> Run:
        return self.run_store.get_run(run_id)

    def run_state(self, run_id: str) -> tuple[dict[str, str], bytes | None]:
        """The run's fields and stored history, in one round trip."""
        return self.run_store.run_state(run_id)

    def update_run(self, run_id: str, **fields: Any) -> None:
        self.run_store.update_run(run_id, **fields)

    def expire_run(self, pipe: Any, run_id: str) -> None:
        self.run_store.expire_run(pipe, run_id)

    def announce_run(self, run_id: str, status: str) -> None:
        """Wake the long-polls on `run_id` (its status was written by a Lua step)."""
        pipe = self.redis.pipeline(transaction=False)
        self.run_store.announce(pipe, run_id, status)
        pipe.execute()

    def save_messages(self, run_id: str, messages_json: bytes) -> None:
        self.run_store.save_messages(run_id, messages_json)

    def load_messages(self, run_id: str) -> bytes | None:
        return self.run_store.load_messages(run_id)

    # ---- the resume outbox and dead letters -----------------------------------------------

    def ensure_group(self, stream: str, group: str) -> None:
        streams.ensure_group(self.redis, stream, group)

    def ack_resume(self, entry_id: str) -> None:
        """Acknowledge an outbox entry and drop it: once its job is enqueued it is history."""
        streams.ack_and_delete(self.redis, self.keys.resumes, RESUMER_GROUP, entry_id)

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
