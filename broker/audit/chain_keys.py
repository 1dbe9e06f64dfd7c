"""Which audit chains a key schema has, and each one's Redis keys.

Its own module so that `broker.audit.trail` (reading and appending) and `broker.audit.sealing`
(hashing) both name a chain without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.store.keys import Keys


@dataclass(frozen=True)
class Chain:
    """One audit chain: its name in exports (`main`, `pN`, `rules`), stream and head keys."""

    name: str
    stream: str
    head: str

    @property
    def seals(self) -> str:
        """Stream: each sealed entry's `prev` and `hash`, under the entry's own id (same slot)."""
        return f"{self.stream}:seals"


def chains_of(keys: Keys) -> list[Chain]:
    """Every chain of this key schema, in a fixed order (pages and exports follow it)."""
    if keys.partitions <= 1:
        return [Chain("main", keys.audit, keys.audit_head)]
    found = [Chain(f"p{view.at}", view.audit, view.audit_head) for view in keys.parts()]
    return [*found, Chain("rules", keys.rules.audit, keys.rules.audit_head)]
