"""Read-only figures about the fleet's Redis: is it up, what server, what the counters say.

`/healthz` pings, `/metrics` reads the counters the steps and the notifiers keep (deliveries by
channel, the dead-letter count, decisions by rule, the rule count), and `approval-broker status`
reads the server, the dead letters and the notifiers' consumers. Each is one short command (no
scan), so a scrape costs the same whatever the volume. This module writes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from redis.exceptions import RedisError

from broker.domain.settings import RedisFsync
from broker.redis.durability import DEFAULT_FSYNC, durability_warning, read_durability
from broker.redis.replies import as_str, as_str_dict
from broker.store.handles import Store
from broker.store.keys import NOTIFIER_GROUP


class Fleet:
    """The fleet's figures (`broker.fleet` on the facade)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def ping(self) -> float:
        """PING Redis; the round trip in milliseconds (a RedisError when it doesn't answer)."""
        started = time.perf_counter()
        self.store.redis.ping()
        return (time.perf_counter() - started) * 1000

    def server(self, chosen: RedisFsync = DEFAULT_FSYNC) -> dict[str, Any]:
        """The Redis server's version, memory in use, the round trip of a PING (ms), and what a
        single Redis says of its AOF (`durability`: None on a cluster), with a warning when it
        keeps less than `chosen` (`broker.redis.durability`)."""
        ping_ms = self.ping()
        info = self.store.redis.info("server") | self.store.redis.info("memory")
        durability = None if self.store.clustered else read_durability(self.store.redis)
        return {
            "version": info.get("redis_version"),
            "used_memory_human": info.get("used_memory_human"),
            "ping_ms": ping_ms,
            "durability": durability.public() if durability else None,
            "durability_warning": durability_warning(durability, chosen) if durability else None,
        }

    def delivery_stats(self) -> dict[str, str]:
        """The notifiers' counters: `delivered:KIND`, `failed:KIND`, `parked:KIND` -> count."""
        return as_str_dict(self.store.redis.hgetall(self.store.keys.stats))

    def dead_letter_count(self) -> int:
        """Entries in the dead-letter stream."""
        return int(self.store.redis.xlen(self.store.keys.dead_letters))

    def rule_hits(self) -> dict[str, str]:
        """Requests decided by each rule: `EFFECT:RULE` (or `shadow:EFFECT:RULE`) -> count."""
        return as_str_dict(self.store.redis.hgetall(self.store.keys.rules.hits))

    def rule_count(self) -> int:
        """Policy rules stored, revoked ones included (they stay listed)."""
        return int(self.store.redis.zcard(self.store.keys.rules.listing))

    def notifier_consumers(self, queues: list[str]) -> list[dict[str, Any]]:
        """The notifier consumers of each queue's stream, in every partition (none for a stream
        no notifier has read yet)."""
        found: list[dict[str, Any]] = []
        for part in self.store.keys.parts():
            for queue in queues:
                try:
                    consumers = self.store.redis.xinfo_consumers(part.stream(queue), NOTIFIER_GROUP)
                except RedisError:  # no stream or no group yet
                    continue
                found += [
                    {
                        "name": as_str(c["name"]),
                        "queue": queue,
                        "idle_s": int(c["idle"]) / 1000,
                        "pending": int(c["pending"]),
                    }
                    for c in consumers
                ]
        return found
