"""Redis Cluster connections, the RQ connection beside them, and waiting for a replica.

`APPROVAL_BROKER_REDIS_CLUSTER=1` (or `[broker] redis_cluster = true`) says that
APPROVAL_BROKER_REDIS_URL names one node of a Redis Cluster; the client finds the others.

RQ stays on a separate single Redis, named by APPROVAL_BROKER_RQ_REDIS_URL, when the broker's
Redis is a cluster. RQ moves a job between many keys in one MULTI (queue list, job hash,
registries), runs Lua whose keys it computes inside the script, and names keys itself with no
hash tag, so on a cluster it fails with CROSSSLOT. Making it cluster-safe would mean patching
RQ's internals on every upgrade; its data (jobs that are re-enqueued from the broker's own
state after a loss) does not need the cluster's capacity or failover.

A patient client (the background roles) retries with a backoff through a master's failover
(`PatientCluster`), and the replicated steps wait for a replica (`wait_for_replicas`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterPipeline, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MovedError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from broker.domain.config import Config
from broker.domain.errors import BrokerError
from broker.domain.settings import Settings
from broker.redis.connection import (
    CONNECT_TIMEOUT_S,
    PATIENT_CONNECT_TIMEOUT_S,
    PATIENT_SOCKET_TIMEOUT_S,
    SOCKET_TIMEOUT_S,
    impatient_options,
)

WAIT_TIMEOUT_MS = 1000
WAIT_ATTEMPTS = 12  # enough to outlast a failover (cluster-node-timeout plus an election)
WAIT_MARKER = ":replicated"  # suffix of the key written before WAIT (see `wait_for_replicas`)
PATIENCE_S = 30.0  # how long a patient client rides out a failover (node timeout + election)
_TRANSIENT = (BusyLoadingError, RedisConnectionError, RedisTimeoutError, ClusterDownError)
_FAILOVER = (*_TRANSIENT, SlotNotCoveredError)
_REDIRECTS = (MovedError, AskError, TryAgainError)  # a slot moving: a transaction sends again
log = logging.getLogger("broker.redis.cluster")


def _patiently(
    call: Any, before_retry: Any = None, errors: tuple[type[Exception], ...] = _FAILOVER
) -> Any:
    """`call()`, retried with a backoff on a failover's `errors` for up to PATIENCE_S."""
    backoff = ExponentialBackoff(cap=1.0, base=0.05)
    deadline = time.monotonic() + PATIENCE_S
    attempt = 0
    while True:
        try:
            return call()
        except errors as exc:
            if time.monotonic() > deadline:
                raise
            if attempt == 0:
                log.warning("cluster: %s; retrying through a failover", type(exc).__name__)
            time.sleep(backoff.compute(attempt))  # a backoff before retrying, not a sync
            attempt += 1
            if before_retry is not None:
                before_retry()


class PatientCluster(RedisCluster):
    """A cluster client that rides out a master's failover.

    redis-py retries a command whose node refused the connection at once, re-reading the slot
    map each time: its attempts are spent in milliseconds, while the cluster still names the
    dead master for the seconds until a replica is promoted. This retries with a backoff,
    around the client's public `execute_command` (every command method goes through it).
    """

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return _patiently(lambda: super(PatientCluster, self).execute_command(*args, **kwargs))  # fmt: skip

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        pipe.__class__ = PatientPipeline  # the same object, its two public methods patient
        pipe.patient_transaction = bool(transaction)
        return pipe


class PatientPipeline(ClusterPipeline):
    """A cluster pipeline that sends its queued commands again after a failover's error.

    It keeps its own list of what was queued (through the public `execute_command`, which
    every command method calls), because a failed `execute` resets the pipeline: before each
    retry the same commands are queued again, in order.

    A transaction also rides out MOVED, ASK and TRYAGAIN replies. While a failover settles or
    a slot migrates, they can outlast redis-py's own few retries (which refresh the slot map
    only every fifth error, and follow an ASK by moving the slot in the map, where the target
    answers MOVED back); a redirection inside MULTI aborts the EXEC, so nothing was applied
    and sending it again, on a refreshed slot map, is safe. A plain pipeline
    follows redirections itself, one command at a time.
    """

    patient_transaction = False

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(self, "patient_queue"):
            self.patient_queue: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.patient_queue.append((args, kwargs))
        return super().execute_command(*args, **kwargs)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued = list(getattr(self, "patient_queue", []))
        self.patient_queue = []
        first = True

        def send() -> list[Any]:
            nonlocal first
            if not first:  # the failed try reset the pipeline: queue the same commands again
                for args, kwargs in queued:
                    ClusterPipeline.execute_command(self, *args, **kwargs)
            first = False
            return ClusterPipeline.execute(self, raise_on_error)

        if not self.patient_transaction:
            return _patiently(send)
        return _patiently(send, self._refresh_slots, (*_FAILOVER, *_REDIRECTS))

    def _refresh_slots(self) -> None:
        """Read the slot map again before a transaction is sent again (best effort)."""
        with contextlib.suppress(*_TRANSIENT):
            self.nodes_manager.initialize()


class ClusterConfigError(BrokerError):
    code = "config"


class NotReplicated(BrokerError):
    """Fewer replicas than asked acknowledged a write within the timeout."""

    code = "not_replicated"

    def __init__(self, detail: str, *, acked: int) -> None:
        super().__init__(detail)
        self.acked = acked


class FailedOver(RedisConnectionError):
    """A write's master failed over before a replica acknowledged it: its fate is unknown.

    A connection error, so the API answers 503 (try again) and the roles retry: every step
    that waits is safe to repeat (a decided request refuses a second decision, a round that
    exists is returned as it is).
    """


def connect_cluster(url: str, *, patient: bool = False) -> RedisCluster:
    """A cluster client from `url` (any node); `patient` rides out a failover, as `connect` does.

    Replies stay bytes, as the single-node client's do.
    """
    if not patient:
        return RedisCluster.from_url(
            url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S
        )
    return PatientCluster.from_url(
        url,
        socket_connect_timeout=PATIENT_CONNECT_TIMEOUT_S,
        socket_timeout=PATIENT_SOCKET_TIMEOUT_S,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), 3, supported_errors=_TRANSIENT),
    )


def rq_connection(
    redis_url: str | None, rq_redis_url: str | None, *, cluster: bool, patient: bool = False
) -> Redis:
    """The single Redis RQ runs on: RQ_REDIS_URL if given, else the broker's own Redis.

    A clustered broker must name one: RQ does not run on a cluster (see the module docstring).
    """
    url = rq_redis_url or (None if cluster else redis_url)
    if url is None:
        raise ClusterConfigError(
            "APPROVAL_BROKER_REDIS_CLUSTER=1 needs APPROVAL_BROKER_RQ_REDIS_URL: "
            "RQ runs on a separate single Redis, not on the cluster"
        )
    if not patient:
        return Redis.from_url(url, **impatient_options())
    return Redis.from_url(
        url,
        socket_connect_timeout=PATIENT_CONNECT_TIMEOUT_S,
        socket_timeout=PATIENT_SOCKET_TIMEOUT_S,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), 25),
        retry_on_error=[BusyLoadingError, RedisConnectionError, RedisTimeoutError],
    )


def marker_key(key: str) -> str:
    """A key in `key`'s slot, beside it, that `wait_for_replicas` may write.

    A hash-tagged key keeps its tag (`ab:{r1}:req` -> `ab:{r1}:req:replicated`); an untagged
    one becomes the tag (`x` -> `{x}:replicated`).
    """
    for candidate in (key + WAIT_MARKER, "{" + key + "}" + WAIT_MARKER):
        if key_slot(candidate.encode()) == key_slot(key.encode()):
            return candidate
    raise ValueError(f"no marker key shares the slot of {key!r}; give it a hash tag")


def wait_for_replicas(
    client: Redis | RedisCluster,
    key: str,
    numreplicas: int = 1,
    timeout_ms: int = WAIT_TIMEOUT_MS,
    *,
    strict: bool = True,
) -> int:
    """Wait until `numreplicas` replicas of `key`'s master hold every write made to it so far.

    WAIT only covers writes made on its own connection, and a cluster client takes a pooled
    connection per command, so this writes a short-lived marker in `key`'s slot and WAITs, both
    on one connection to the master: the marker's replication offset is past every write that
    master had acknowledged before, the caller's included. Returns how many replicas acked;
    `strict` raises NotReplicated when fewer than asked did. A transient error is retried on
    the same master (the marker is idempotent). If the key's master changed in between (a
    failover), the write may have died with the old master, and a WAIT on the new one would
    vouch for it all the same: FailedOver is raised instead, strict or not. `client` is typed
    as the store's (a `Redis`, or a `RedisCluster` on a cluster); only a cluster client has
    replicas to wait for.
    """
    if not isinstance(client, RedisCluster):
        raise TypeError(f"waiting for replicas needs a cluster client, not {type(client).__name__}")
    marker = marker_key(key)
    backoff = ExponentialBackoff(cap=1.0, base=0.05)
    first: str | None = None
    for attempt in range(WAIT_ATTEMPTS):
        try:
            node = client.get_node_from_key(key)
            assert node is not None and node.redis_connection is not None
            first = first or node.name
            if node.name != first:
                raise FailedOver(
                    f"the master of {key!r} failed over before a replica acknowledged a write "
                    "to it; the write may be lost: try again"
                )
            pipe = node.redis_connection.pipeline(transaction=False)
            pipe.set(marker, b"1", px=max(timeout_ms * 2, 1000))
            pipe.execute_command("WAIT", numreplicas, timeout_ms)
            _, acked = pipe.execute()
            break
        except FailedOver:
            raise
        except (*_TRANSIENT, MovedError, TryAgainError):
            if attempt == WAIT_ATTEMPTS - 1:
                raise
            time.sleep(backoff.compute(attempt))  # a backoff before retrying, not a sync
            with contextlib.suppress(*_TRANSIENT):
                client.nodes_manager.initialize()
    acked = int(acked)
    if strict and acked < numreplicas:
        raise NotReplicated(
            f"{acked} of {numreplicas} replica(s) acknowledged the write within {timeout_ms} ms",
            acked=acked,
        )
    return acked


def clustered(settings: Settings, config: Config) -> bool:
    """APPROVAL_BROKER_REDIS_CLUSTER=1 or `[broker] redis_cluster = true`: either one says so."""
    return settings.redis_cluster or config.broker.redis_cluster
