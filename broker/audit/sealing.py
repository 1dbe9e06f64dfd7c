"""Sealing the audit chains: each new entry's `prev` and `hash`, computed here, stored in Redis.

The Lua steps append an entry without its hash (chain.lua): a SHA-256 in Redis's Lua cost
about 0.25 ms of Redis's one thread per entry, most of what a create or a decision cost there,
and `hashlib` does it in about a microsecond. A sealer reads a chain's entries after its sealed
point, hashes them in order (`chain.entry_hash`, `prev` the hash before) and stores the hashes
in the chain's seals stream under each entry's id with seal.lua, which refuses when another
sealer moved the sealed point first (the loser reads again). So the chain is the same whoever
seals it, and any number of sealers can run.

The sweeper seals every chain about once a second (`SEAL_EVERY_S`), and every read
(`AuditTrail.entries`, `page`, `heads`: `GET /v1/audit`, `audit export|verify`) seals first, so a
reader never sees an entry without its hash.
"""

from __future__ import annotations

from typing import Any

from broker.audit.chain import entry_hash
from broker.audit.chain_keys import Chain
from broker.redis.replies import as_str
from broker.store.scripts import seal_source

SEAL_BATCH = 500
"""Entries hashed and stored per seal step: a step holds Redis a few µs per entry."""
SEAL_EVERY_S = 1.0
"""How often the sweeper seals every chain: about the longest an entry waits for its hash."""


def hashed_inline(fields: dict[Any, Any]) -> bool:
    """Whether an entry carries its own hash (written before sealing, hashed in its step)."""
    return any(as_str(name) == "hash" for name in fields)


def seal(redis: Any, chain: Chain, *, batch: int = SEAL_BATCH) -> int:
    """Hash and store every entry of `chain` appended before this call; returns how many this
    call sealed (another sealer may have sealed some of them)."""
    script = redis.register_script(seal_source())
    done = 0
    while True:
        sealed, sealed_id, digest = redis.hmget(chain.head, ["sealed", "sealed_id", "hash"])
        if sealed is None:  # nothing appended since sealing began (chain.lua sets these)
            return done
        rows = redis.xrange(chain.stream, "(" + as_str(sealed_id), "+", count=batch)
        if not rows:
            return done
        prev, seq, hashed = as_str(digest) if digest is not None else "", as_str(sealed), []
        for entry_id, fields in rows:
            values = {as_str(k): as_str(v) for k, v in fields.items()}
            seq = values.get("seq", seq)
            if hashed_inline(values):  # hashed in its step by a process from before sealing
                prev = values["hash"]
                continue
            values["prev"] = prev
            prev = entry_hash(values)
            hashed += [as_str(entry_id), values["prev"], prev]
        moved = [as_str(sealed), seq, as_str(rows[-1][0]), prev]
        if int(script(keys=[chain.head, chain.seals, chain.stream], args=[*moved, *hashed])):
            done += len(hashed) // 3
            if len(rows) < batch:
                return done
