"""What every broker service works on: one Redis client, its scripts, the key schema, the config.

The services (`requests`, `decisions`, `sweeping`, `run_store`, `dead_letters`) share one
`Store`, so a change to the config (tests do that) is seen by all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import Config
from broker.domain.errors import InvalidInput
from broker.domain.receipts import Receipts, receipts_for
from broker.store.keys import Keys
from broker.store.partitions import CLUSTER_PARTITIONS
from broker.store.scripts import Scripts


@dataclass
class Store:
    redis: Redis
    config: Config
    keys: Keys
    scripts: Scripts
    rq: Redis | None = None
    """The single Redis RQ runs on, when it is not `redis` (a cluster: `broker.redis.cluster`)."""

    @property
    def rq_redis(self) -> Redis:
        return self.rq if self.rq is not None else self.redis

    def __post_init__(self) -> None:
        """On a Redis Cluster the keys are split into partitions (`broker.store.keys`): as many as
        `[broker] partitions` says, else CLUSTER_PARTITIONS; a single Redis keeps one. The
        steps get the audit chain's keys while `[audit] enabled` (`Keys.audit_keep_s`)."""
        if isinstance(self.redis, RedisCluster) and self.keys.partitions <= 1:
            wanted = getattr(self.config.broker, "partitions", None) or CLUSTER_PARTITIONS
            self.keys = replace(self.keys, partitions=int(wanted))
        audit = self.config.audit
        keep = int(audit.retention_days * 86400) if audit.enabled else 0
        if self.keys.audit_keep_s != keep:
            self.keys = replace(self.keys, audit_keep_s=keep)
        self.scripts.keys = self.keys

    @property
    def clustered(self) -> bool:
        return self.keys.partitions > 1

    @property
    def maxlen(self) -> int:
        """Approximate length cap of every stream the broker writes."""
        return self.config.broker.stream_maxlen

    @property
    def retention(self) -> int:
        """Seconds a decided request (or an ended run) is kept."""
        return int(self.config.broker.retention_s)

    @property
    def receipts(self) -> Receipts | None:
        """The receipt signer and checker of `[receipts]`, or None when no key is configured."""
        section = self.config.receipts
        if section.key_file is None:
            return None
        return receipts_for(section.key_file, tuple(section.previous_key_files), section.ttl_s)

    def check_queue(self, queue: str) -> None:
        if queue not in self.config.queues:
            known = ", ".join(sorted(self.config.queues))
            raise InvalidInput(
                f"queue {queue!r} is not defined (known: {known})", code="unknown_queue"
            )
