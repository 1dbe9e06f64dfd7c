"""The Redis a fleet process starts or joins: the CLI's and `up`'s way to it, never `broker.redis`.

`approval-broker up` starts the embedded Redis (`broker.redis.embedded`: a private
redis-server, AOF on, in the user's data directory) and runs every role on it; a command joins
the Redis APPROVAL_BROKER_REDIS_URL names, else the one `up` runs. The launcher and its URL
helpers are re-exported here, and the few things done to a Redis before there is a broker on it
(is it a cluster? empty it for `up --fresh`; how durable is it: `broker.redis.durability`)
are functions or re-exports here, so the CLI and the channels
reach the core through its face (the import contract in pyproject.toml). The secret files a fleet
on the embedded Redis shares (the email links' key) live in its data directory, found here too.
Nothing here reads or writes the broker's keys: that is the store's, through `Broker`.
"""

from __future__ import annotations

from redis.exceptions import ResponseError

from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.cluster import clustered
from broker.redis.connection import connect
from broker.redis.durability import (
    DEFAULT_FSYNC,
    Durability,
    chosen_fsync,
    durability_warning,
    warning_for,
)
from broker.redis.embedded import (
    EmbeddedRedis,
    private_secret,
    redact,
    redis_dir,
    running_local_url,
    running_urls,
)

__all__ = [
    "DEFAULT_FSYNC",
    "Durability",
    "EmbeddedRedis",
    "chosen_fsync",
    "durability_warning",
    "warning_for",
    "cluster_enabled",
    "clustered",
    "embedded_secret",
    "empty",
    "joined",
    "redact",
    "redis_dir",
    "running_local_url",
]


def joined(settings: Settings, config: Config) -> Broker | None:
    """A broker on APPROVAL_BROKER_REDIS_URL, else on the embedded Redis that `up` runs (its
    Unix socket when it has one); None when there is neither. Impatient: a command's client."""
    url = settings.redis_url or running_local_url(settings.data_dir and settings.data_dir / "redis")
    if not url:
        return None
    if clustered(settings, config):  # the cluster for the broker's keys, RQ's own Redis
        return Broker.from_settings(settings, config)
    return Broker(connect(url), config, prefix=settings.key_prefix)


def cluster_enabled(url: str) -> bool:
    """Whether the Redis at `url` is a cluster node (`INFO cluster`); False for a Redis that
    doesn't know the section (or renamed INFO)."""
    try:
        enabled = connect(url).info("cluster").get("cluster_enabled")
    except ResponseError:
        return False
    return enabled in (1, "1")


def empty(url: str) -> None:
    """Empty the Redis at `url` (FLUSHALL): `up --fresh`, on the embedded Redis it runs only."""
    connect(url).flushall()


def embedded_secret(settings: Settings, name: str) -> str | None:
    """The random secret kept in file `name` of the embedded Redis's data directory (0600, made
    on first use; racing makers agree), when the settings' Redis is that embedded one (its URL
    is one the directory names); None for any other Redis (a production fleet sets its own)."""
    here = redis_dir(settings.data_dir)
    if not settings.redis_url or settings.redis_url not in running_urls(here):
        return None
    return private_secret(here / name)
