"""How durable the broker's Redis is: the fsync policy chosen for it, and a check of a running one.

"Durable" means fsynced. The embedded Redis runs `appendonly yes` with `appendfsync always`:
Redis writes and fsyncs its AOF before it sends the answer to a write, so a crash of Redis or
of the machine loses nothing the broker was told had happened. `everysec` is a choice an
operator makes (`[broker] redis_fsync`, APPROVAL_BROKER_REDIS_FSYNC): Redis then fsyncs about
once a second in a background thread, and while one of those fsyncs is still running (a busy
disk) it holds the AOF writes of newer commands in memory for up to 2 s, answering them all the
same. So a crash of the machine can lose the last 1-2 s of acknowledged writes, and a SIGKILL
or crash of Redis alone up to 2 s when the disk is slow.

The broker can't set the policy of a Redis it did not start (APPROVAL_BROKER_REDIS_URL): the
roles and `status` read it (`INFO persistence`; `CONFIG GET appendfsync`, which a least-privilege
ACL user may be refused: then nothing is said about it) and warn when it keeps less than the
chosen policy. They never change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from broker.domain.config import Config
from broker.domain.settings import RedisFsync, Settings
from broker.redis.connection import connect

DEFAULT_FSYNC: RedisFsync = "always"
FSYNC_CHOICES: tuple[RedisFsync, ...] = ("always", "everysec")
STRENGTH = {"always": 2, "everysec": 1, "no": 0}
"""Redis's `appendfsync` values, from the one that loses nothing acknowledged to the one that
leaves flushing to the OS."""


def chosen_fsync(settings: Settings, config: Config) -> RedisFsync:
    """APPROVAL_BROKER_REDIS_FSYNC when set, else `[broker] redis_fsync` (default "always")."""
    return settings.redis_fsync or config.broker.redis_fsync


@dataclass(frozen=True)
class Durability:
    """What a running Redis says about its AOF: None where it would not say."""

    aof: bool | None
    appendfsync: str | None

    def public(self) -> dict[str, Any]:
        return {"aof": self.aof, "appendfsync": self.appendfsync}

    def describe(self) -> str:
        """One line for `status`: `AOF on, appendfsync always`."""
        aof = {True: "AOF on", False: "AOF off", None: "AOF unknown"}[self.aof]
        fsync = self.appendfsync or "unknown (CONFIG GET refused)"
        return f"{aof}, appendfsync {fsync}"


def asks_config(redis: Redis) -> bool:
    """Whether `CONFIG GET` may be asked: only as the `default` user. An ACL user of its own
    (docs/security.md's `approval-broker` user) is never given CONFIG, an admin command, and a
    refused one would show in Redis's ACL LOG as if the broker probed for secrets."""
    try:
        kwargs = redis.get_connection_kwargs()
    except AttributeError:  # a cluster client: no single connection's settings
        return False
    return kwargs.get("username") in (None, "", "default")


def read_durability(redis: Redis) -> Durability:
    """The AOF state (`INFO persistence`) and `appendfsync` (`CONFIG GET`) of a running Redis.

    `appendfsync` is asked only as the `default` user (`asks_config`). A Redis that refuses
    either answer (a managed service that renames CONFIG) leaves that part None; nothing here
    raises on a refusal.
    """
    aof: bool | None
    try:
        enabled = redis.info("persistence").get("aof_enabled")
        aof = None if enabled is None else str(enabled) == "1"
    except RedisConnectionError:  # not reachable: whoever needs it says so, not this check
        return Durability(None, None)
    except RedisError:
        aof = None
    if not asks_config(redis):
        return Durability(aof, None)
    try:
        found = redis.config_get("appendfsync")
        value = found.get("appendfsync") if isinstance(found, dict) else None
        fsync = value.decode() if isinstance(value, bytes) else value
    except RedisError:
        fsync = None
    return Durability(aof, fsync if isinstance(fsync, str) and fsync else None)


def durability_warning(found: Durability, chosen: RedisFsync = DEFAULT_FSYNC) -> str | None:
    """What to tell the operator when Redis keeps less than `chosen`; None when it keeps as
    much, or when it would not say."""
    if found.aof is False:
        return (
            "Redis runs without an AOF (appendonly no): a crash loses every write since its "
            f"last snapshot, if any; set `appendonly yes` and `appendfsync {chosen}` on it"
        )
    if found.appendfsync is None or found.appendfsync not in STRENGTH:
        return None
    if STRENGTH[found.appendfsync] >= STRENGTH[chosen]:
        return None
    if found.appendfsync == "everysec":
        loss = "a crash can lose up to about 2 s of acknowledged writes"
    else:
        loss = "a crash of the machine can lose whatever the OS had not written yet"
    choice = "" if chosen == "everysec" else ' (or accept it: [broker] redis_fsync = "everysec")'
    return (
        f"Redis runs appendfsync {found.appendfsync}: {loss}; set `appendfsync {chosen}` "
        f"on it{choice}"
    )


def warning_for(url: str, chosen: RedisFsync) -> str | None:
    """`durability_warning` for the Redis at `url`, read with a short-lived impatient client;
    None when it can't be reached (the caller meets that soon enough)."""
    client = connect(url)
    try:
        return durability_warning(read_durability(client), chosen)
    finally:
        client.close()
