"""An audit entry, its canonical form and hash, and checking a sequence of entries.

The hash is sha256 over the canonical form of every field but `hash`, `prev` included: each
value as `<length in bytes>:<value>`, joined by "\n", in FIELDS order. lib.lua's audit() writes
exactly this form when it appends, so what Redis holds, what `audit export` writes and what
`audit verify` recomputes agree byte for byte. Never touches Redis.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

FIELDS = (
    "seq",
    "at",
    "request_id",
    "event",
    "actor",
    "actor_kind",
    "outcome",
    "args_hash",
    "detail",
    "prev",
)
"""The hashed fields, in the order of the canonical form (lib.lua's AUDIT_FIELDS)."""


class Entry(BaseModel):
    """One audit entry as exported: the hashed fields, `hash`, and the chain it belongs to
    (`chain`: the partition, not hashed: a layout name, not part of what happened)."""

    model_config = ConfigDict(extra="forbid")

    chain: str
    seq: int
    at: str
    request_id: str = ""
    event: str
    actor: str = ""
    actor_kind: str = "system"
    outcome: str = ""
    args_hash: str = ""
    detail: str = ""
    prev: str = ""
    hash: str


def canonical(values: dict[str, Any]) -> bytes:
    """The bytes an entry's hash is computed over (see the module docstring)."""
    parts = []
    for name in FIELDS:
        raw = str(values.get(name, "")).encode()
        parts.append(str(len(raw)).encode() + b":" + raw)
    return b"\n".join(parts)


def entry_hash(values: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(values)).hexdigest()


@dataclass(frozen=True)
class Problem:
    """The first place a sequence of entries is not a whole chain: `line` (1-based, of the
    file or the listing), the chain and seq found there, and what is wrong."""

    line: int
    chain: str
    seq: int | None
    kind: str  # changed | removed | reordered | invalid
    detail: str

    def __str__(self) -> str:
        where = f"line {self.line}" + (
            f" (chain {self.chain}, seq {self.seq})" if self.chain else ""
        )
        return f"{where}: entry {self.kind}: {self.detail}"


def parse_line(line: int, text: str) -> Entry | Problem:
    """An entry from one line of an export, or the Problem of a line that is not one."""
    try:
        return Entry.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "line"
        return Problem(line, "", None, "invalid", f"not an audit entry ({where}: {first['msg']})")


def verify(entries: Sequence[tuple[int, Entry | Problem]]) -> tuple[Problem | None, dict[str, int]]:
    """Check `(line, entry)` pairs in order: per chain, each entry's hash is its own, its
    `prev` is the hash of the chain's entry before it and its seq one more. The first entry
    of each chain is its anchor (entries before it may have been trimmed or not exported): its
    `prev` is taken as given. Returns the first Problem (or None) and the entries per chain.

    A changed byte shows as `changed` (the hash no longer matches its fields, or a `prev` no
    longer matches the entry before); a removed entry as `removed` (a seq skipped that appears
    nowhere); two swapped entries as `reordered` (a seq skipped that comes later, or a seq
    going back).
    """
    present = {(e.chain, e.seq) for _, e in entries if isinstance(e, Entry)}
    last: dict[str, Entry] = {}
    counts: dict[str, int] = {}
    for line, entry in entries:
        if isinstance(entry, Problem):
            return entry, counts
        found = _check(line, entry, last.get(entry.chain), present)
        if found is not None:
            return found, counts
        last[entry.chain] = entry
        counts[entry.chain] = counts.get(entry.chain, 0) + 1
    return None, counts


def _check(
    line: int, entry: Entry, before: Entry | None, present: set[tuple[str, int]]
) -> Problem | None:
    def problem(kind: str, detail: str) -> Problem:
        return Problem(line, entry.chain, entry.seq, kind, detail)

    if entry_hash(entry.model_dump()) != entry.hash:
        return problem("changed", "its hash does not match its fields")
    if before is None:
        return None
    if entry.seq <= before.seq:
        return problem("reordered", f"seq {entry.seq} comes after seq {before.seq}")
    if entry.seq > before.seq + 1:
        gap = range(before.seq + 1, entry.seq)
        later = [n for n in gap if (entry.chain, n) in present]
        if later:
            return problem("reordered", f"seq {later[0]} comes later in the file, not before it")
        span = f"seq {gap[0]}" + (f" to {gap[-1]}" if len(gap) > 1 else "")
        return problem("removed", f"{span} missing before it")
    if entry.prev != before.hash:
        return problem("changed", f"its prev is not the hash of seq {before.seq}")
    return None
