"""The audit chains in Redis: which there are, reading them in pages, appending from Python.

A single Redis has one chain (`ab:audit`); a cluster one per partition (`{ab:pN}:audit`, each
appended by the steps of that partition) and one for the rules' slot (`{ab:rules}:audit`).
The Lua steps append their own entries (lib.lua, audit()); `append_entry` is the way in for a
change made outside them (rules, receipts), queued in the caller's MULTI when it has one. An
entry's `prev` and `hash` are in the chain's seals stream under the entry's id (written by
`broker.audit.sealing`; inline in entries written before sealing): every read seals first and
joins the two.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.client import Pipeline

from broker.audit.actors import actor_kind
from broker.audit.chain import Entry
from broker.audit.sealing import hashed_inline, seal
from broker.domain.errors import InvalidInput
from broker.domain.stream_ids import BadStreamId, stream_id
from broker.redis.replies import as_str
from broker.store.keys import Keys
from broker.store.script_keys import ScriptKeys
from broker.store.scripts import source


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


def stream_bound(when: datetime | None, *, end: bool = False) -> str:
    """An XRANGE bound for a time (`-`/`+` for none): entry ids are Redis's clock in ms."""
    if when is None:
        return "+" if end else "-"
    return str(max(int(when.timestamp() * 1000), 0))  # before 1970: from the start


def entry_of(chain: str, fields: dict[Any, Any], sealed: dict[Any, Any] | None = None) -> Entry:
    """An entry from its stream fields and its seal (`prev`, `hash`; none: hashed inline)."""
    values = {as_str(k): as_str(v) for k, v in {**fields, **(sealed or {})}.items()}
    values.setdefault("hash", "")  # none a sealer could give (not expected): verify names it
    return Entry.model_validate({**values, "chain": chain, "seq": int(values.get("seq", 0))})


class AuditTrail:
    """Read the chains of one broker's Redis (standalone or cluster)."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.chains = chains_of(keys)

    @property
    def enabled(self) -> bool:
        """Whether the steps append entries now (`[audit] enabled`); reading works either way."""
        return self.keys.audit_keep_s > 0

    def seal(self) -> int:
        """Seal every chain (hash what was appended since the last seal): the sweeper's job,
        which any reader may also do. Returns the entries this call sealed."""
        return sum(seal(self.redis, chain) for chain in self.chains)

    def entries(
        self, since: datetime | None = None, until: datetime | None = None, *, page: int = 500
    ) -> Iterator[Entry]:
        """Every entry from `since` to `until`, chain by chain, each chain in order."""
        for chain in self.chains:
            start, end = stream_bound(since), stream_bound(until, end=True)
            while True:
                rows = self.redis.xrange(chain.stream, start, end, count=page)
                yield from self._sealed(chain, rows)
                if len(rows) < page:
                    break
                start = "(" + as_str(rows[-1][0])

    def _sealed(self, chain: Chain, rows: list[Any]) -> list[Entry]:
        """The entries of `rows` (read from `chain`'s stream) with their `prev` and `hash`,
        sealing the chain first when one of them has none yet."""
        if not rows:
            return []
        seals = self._seals_of(chain, rows)
        if any(as_str(i) not in seals and not hashed_inline(f) for i, f in rows):
            seal(self.redis, chain)
            seals = self._seals_of(chain, rows)
        return [entry_of(chain.name, fields, seals.get(as_str(i))) for i, fields in rows]

    def _seals_of(self, chain: Chain, rows: list[Any]) -> dict[str, dict[Any, Any]]:
        """The seals stored for the ids `rows` spans (some may be of entries since removed)."""
        found = self.redis.xrange(chain.seals, rows[0][0], rows[-1][0])
        return {as_str(entry_id): fields for entry_id, fields in found}

    def page(
        self, since: datetime | None, cursor: str | None, limit: int
    ) -> tuple[list[Entry], str | None]:
        """One page of entries (from `since`, or where `cursor` left off) and the next cursor."""
        index, start = (0, stream_bound(since)) if cursor is None else decode_cursor(cursor)
        if index >= len(self.chains):
            raise InvalidInput("cursor: not a cursor this listing gave", code="bad_cursor")
        found: list[Entry] = []
        while index < len(self.chains) and len(found) < limit:
            chain = self.chains[index]
            rows = self.redis.xrange(chain.stream, start, "+", count=limit - len(found))
            found += self._sealed(chain, rows)
            if len(found) >= limit and rows:
                return found, encode_cursor(index, "(" + as_str(rows[-1][0]))
            index, start = index + 1, stream_bound(since)
        return found, None

    def heads(self) -> dict[str, tuple[int, str]]:
        """Each chain's last seq and hash (kept apart from the stream: trimming keeps it),
        after sealing it. The hash is the last entry's only if every entry appended was found
        and sealed ("" otherwise: the last entries went from the stream)."""
        out = {}
        for chain in self.chains:
            seal(self.redis, chain)
            seq, sealed, digest = self.redis.hmget(chain.head, ["seq", "sealed", "hash"])
            if seq is not None:
                whole = sealed is None or as_str(sealed) == as_str(seq)
                out[chain.name] = (int(seq), as_str(digest) if whole else "")
        return out


def encode_cursor(index: int, start: str) -> str:
    raw = json.dumps([index, start], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """(chain index, XRANGE start) of a cursor `page` gave; InvalidInput `bad_cursor` else."""
    bad = InvalidInput("cursor: not a cursor this listing gave", code="bad_cursor")
    if len(cursor) > 200:
        raise bad
    try:
        parts = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise bad from None
    if not (isinstance(parts, list) and len(parts) == 2):
        raise bad
    index, start = parts
    if not (isinstance(index, int) and 0 <= index < 10_000 and isinstance(start, str)):
        raise bad
    if not start.startswith("("):
        raise bad
    try:  # the one reader of stream ids from outside: what Redis refuses is refused here
        return index, "(" + stream_id(start[1:])
    except BadStreamId:
        raise bad from None


def append_entry(
    redis: Any,
    stream: str,
    head: str,
    *,
    event: str,
    actor: str | None,
    request_id: str = "",
    outcome: str = "",
    args_hash: str = "",
    detail: str = "",
    keep_s: int = 0,
    client: Any = None,
) -> Any:
    """Append one entry to the chain (`stream`, `head`: `Keys.audit`/`Keys.audit_head` of the
    change's partition, or `RuleKeys.audit`...) with broker/scripts/audit.lua.

    For a change made outside the Lua steps (a rule created or revoked, a receipt spent or
    refused): pass the caller's MULTI pipeline as `client` and the entry is written in the same
    atomic step as the change (the reply is then in the pipeline's). `actor_kind` is read from
    `actor` (`broker.audit.actors`). Returns the new entry's seq when run on its own.
    """
    keys = ScriptKeys().audit(stream, head, keep_s)
    values = {
        "event": event,
        "actor": actor or "",
        "actor_kind": actor_kind(actor),
        "request_id": request_id,
        "outcome": outcome,
        "args_hash": args_hash,
        "detail": detail,
    }
    script = redis.register_script(source("audit"))
    target = client if isinstance(client, Pipeline) else None
    return script(keys=keys.keys, args=[keys.args(**values)], client=target)
