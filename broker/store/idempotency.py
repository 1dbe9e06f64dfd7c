"""Idempotency keys as stored: one string per (scope, caller, key) holding `BODY_HASH|ID`.

A create with an `Idempotency-Key` claims its key with `SET NX` (no id yet: `HASH|`), so of
concurrent creates with one key exactly one creates; it then fills in the id it made, or
releases the claim when it failed, so errors are not replayed. What a caller does while another
holds the claim (wait, give up, answer the original) is the API's (`api.idempotency`); this
module only names the key (`Keys.idempotency`) and runs its commands.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from redis import Redis

from broker.redis.replies import as_str
from broker.store.handles import Store


@dataclass(frozen=True)
class Claim:
    """One caller's idempotency key in one scope (`requests`, `runs`)."""

    redis: Redis
    key: str

    def take(self, body_hash: str, ttl_s: int) -> bool:
        """Claim the key for a create of `body_hash`; False when it is held or filled already."""
        return bool(self.redis.set(self.key, f"{body_hash}|", nx=True, ex=ttl_s))

    def fill(self, body_hash: str, made: str, ttl_s: int) -> None:
        """Record the id the create made, kept `ttl_s` seconds."""
        self.redis.set(self.key, f"{body_hash}|{made}", ex=ttl_s)

    def release(self) -> None:
        """Give the claim up (the create failed)."""
        self.redis.delete(self.key)

    def read(self) -> tuple[str, str] | None:
        """The body hash and the id made (`""` while the claim is still in progress), or None."""
        raw = self.redis.get(self.key)
        if raw is None:
            return None
        body_hash, _, made = as_str(raw).partition("|")
        return body_hash, made


class IdempotencyKeys:
    """The idempotency keys of the create routes (`broker.idempotency` on the facade)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def claim(self, scope: str, caller: str, idempotency_key: str) -> Claim:
        """The stored key of `caller`'s `idempotency_key` in `scope` (hashed: a key name never
        holds what a caller sent)."""
        digest = hashlib.sha256(f"{caller}\0{idempotency_key}".encode()).hexdigest()
        return Claim(self.store.redis, self.store.keys.idempotency(scope, digest))
