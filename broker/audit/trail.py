"""The audit chains in Redis: which there are, reading them in pages, appending from Python.

A single Redis has one chain (`ab:audit`); a cluster one per partition (`{ab:pN}:audit`, each
appended by the steps of that partition) and one for the rules' slot (`{ab:rules}:audit`).
The Lua steps append their own entries (lib.lua, audit()); `append_entry` is the way in for a
change made outside them (rules, receipts), queued in the caller's MULTI when it has one.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redis.client import Pipeline

from broker.audit.actors import actor_kind
from broker.audit.chain import Entry
from broker.domain.errors import InvalidInput
from broker.redis.replies import as_str
from broker.store.keys import Keys
from broker.store.script_keys import ScriptKeys
from broker.store.scripts import source

_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}", re.ASCII)


@dataclass(frozen=True)
class Chain:
    """One audit chain: its name in exports (`main`, `pN`, `rules`), stream and head keys."""

    name: str
    stream: str
    head: str


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


def entry_of(chain: str, fields: dict[Any, Any]) -> Entry:
    values = {as_str(k): as_str(v) for k, v in fields.items()}
    return Entry.model_validate({**values, "chain": chain, "seq": int(values.get("seq", 0))})


class AuditTrail:
    """Read the chains of one broker's Redis (standalone or cluster)."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.chains = chains_of(keys)

    def entries(
        self, since: datetime | None = None, until: datetime | None = None, *, page: int = 500
    ) -> Iterator[Entry]:
        """Every entry from `since` to `until`, chain by chain, each chain in order."""
        for chain in self.chains:
            start, end = stream_bound(since), stream_bound(until, end=True)
            while True:
                rows = self.redis.xrange(chain.stream, start, end, count=page)
                for _, fields in rows:
                    yield entry_of(chain.name, fields)
                if len(rows) < page:
                    break
                start = "(" + as_str(rows[-1][0])

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
            found += [entry_of(chain.name, fields) for _, fields in rows]
            if len(found) >= limit and rows:
                return found, encode_cursor(index, "(" + as_str(rows[-1][0]))
            index, start = index + 1, stream_bound(since)
        return found, None

    def heads(self) -> dict[str, tuple[int, str]]:
        """Each chain's last seq and hash (kept apart from the stream: trimming keeps it)."""
        out = {}
        for chain in self.chains:
            seq, digest = self.redis.hmget(chain.head, ["seq", "hash"])
            if seq is not None:
                out[chain.name] = (int(seq), as_str(digest))
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
    if not (start.startswith("(") and _STREAM_ID.fullmatch(start[1:])):
        raise bad
    return index, start


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
