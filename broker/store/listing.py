"""Listing requests a page at a time, from the one index that answers the filter.

The Lua steps that change a request keep its listing indexes (`broker/store/keys.py`, `ix:*`), so a
page costs one index read (page.lua: O(log N + page)) and a pipeline of hashes, whatever else
is stored. A cursor is the (score, id) of the last item read, exclusive: paging while requests
arrive gives no item twice and skips none that was there when paging began (an item that
changes while one pages, decided or escalated, may move past the cursor). This module only
reads; it never decides who may see what (the caller's `keep` does).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from redis.commands.core import Script

from broker.domain import bounded_json
from broker.domain.errors import InvalidInput
from broker.domain.models import Request, Status
from broker.redis.replies import as_str
from broker.store.handles import Store
from broker.store.keys import Keys
from broker.store.scripts import source

MAX_SCAN = 2000
"""At most this many index entries are read for one filtered page: a page may come back short,
with a cursor to go on from."""


@dataclass(frozen=True)
class Filter:
    status: Status | None = None
    queue: str | None = None
    run_id: str | None = None
    created_by: str | None = None

    def matches(self, r: Request) -> bool:
        return (
            (self.status is None or r.status is self.status)
            and (self.queue is None or r.queue == self.queue)
            and (self.run_id is None or r.run_id == self.run_id)
            and (self.created_by is None or r.created_by == self.created_by)
        )


@dataclass(frozen=True)
class Page:
    """One page of a listing; `next_cursor` is None when the index has nothing after it."""

    items: list[Request]
    next_cursor: str | None


def encode_cursor(index: str, score: str, rid: str) -> str:
    raw = json.dumps([index, score, rid], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_SCORE = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)
"""A sorted-set score as Redis writes it (finite: no `nan`, `inf`, hex or spaces)."""
_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}", re.ASCII)
MAX_CURSOR = 1000
"""Characters of a cursor: the ones this listing gives are about a hundred."""


def _not_a_cursor() -> InvalidInput:
    return InvalidInput("cursor: not a cursor this listing gave", code="bad_cursor")


def decode_cursor(cursor: str, index: str) -> tuple[str, str]:
    """(score, id) of a cursor made for `index`; InvalidInput (`bad_cursor`, 422) for any other
    text: bad base64, not a JSON list of three strings, a score that isn't a finite number as
    Redis writes one, an id no request could have, or too long. A cursor is a client's text:
    nothing of it reaches Redis unchecked."""
    if len(cursor) > MAX_CURSOR:
        raise _not_a_cursor()
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        parts = bounded_json.loads(raw, "cursor", max_bytes=MAX_CURSOR, max_depth=1)
    except (binascii.Error, ValueError, InvalidInput):
        raise _not_a_cursor() from None
    if not isinstance(parts, list) or len(parts) != 3 or not all(isinstance(p, str) for p in parts):
        raise _not_a_cursor()
    got_index, score, rid = parts
    if (
        _SCORE.fullmatch(score) is None
        or len(score) > 40
        or not math.isfinite(float(score))
        or _ID.fullmatch(rid) is None
    ):
        raise _not_a_cursor()
    if got_index != index:
        raise InvalidInput(
            "cursor: it was made for other filters; start again without it", code="bad_cursor"
        )
    return score, rid


class Listing:
    def __init__(self, store: Store, fetch: Callable[[list[str]], list[Request]]) -> None:
        self.store = store
        self.fetch = fetch

    @cached_property
    def _page_script(self) -> Script:
        return self.store.redis.register_script(source("page"))

    def index_for(self, f: Filter, keys: Keys | None = None) -> tuple[str, bool]:
        """The index key that answers `f` with the least reading (in `keys`' partition), and
        whether it reads highest score first (newest first; pending lists and a run's requests
        read soonest first)."""
        keys = keys or self.store.keys
        if f.run_id:
            return keys.run_requests(f.run_id), False
        if f.created_by:
            return keys.by_creator(f.created_by), True
        if f.status is Status.pending:
            return (keys.pending_in(f.queue) if f.queue else keys.expiry), False
        if f.status is not None:
            s = f.status.value
            return (keys.done_in(s, f.queue) if f.queue else keys.done(s)), True
        return (keys.in_queue(f.queue) if f.queue else keys.requests), True

    def indexes_for(self, f: Filter) -> tuple[list[str], bool]:
        """`index_for` in every partition (a run's requests are all in its own)."""
        if f.run_id or self.store.keys.partitions <= 1:
            index, rev = self.index_for(f)
            return [index], rev
        pairs = [self.index_for(f, keys) for keys in self.store.keys.parts()]
        return [index for index, _ in pairs], pairs[0][1]

    def _merged(
        self, indexes: list[str], rev: bool, after: tuple[str, str] | None, n: int
    ) -> list[tuple[str, str]]:
        """The first `n` entries after `after` of all `indexes` together, in index order
        (score, then id, as a sorted set orders them): a k-way merge whose cursor is the one
        (score, id) of the last entry, the same for every partition."""
        if len(indexes) == 1:
            return self._read(indexes[0], rev, after, n)
        entries = [e for index in indexes for e in self._read(index, rev, after, n)]
        entries.sort(key=lambda e: (float(e[1]), e[0]), reverse=rev)
        return entries[:n]

    def _read(
        self, index: str, rev: bool, after: tuple[str, str] | None, n: int
    ) -> list[tuple[str, str]]:
        keys = self.store.keys.page_keys(index)
        args: dict[str, object] = {"limit": n, "rev": rev}
        if after:
            args.update(s=after[0], i=after[1])
        flat = self._page_script(keys=keys.keys, args=[keys.args(**args)])
        text = [as_str(x) for x in flat]
        return list(zip(text[0::2], text[1::2], strict=True))

    def page(
        self,
        f: Filter,
        *,
        limit: int = 100,
        cursor: str | None = None,
        keep: Callable[[Request], bool] | None = None,
        max_scan: int = MAX_SCAN,
    ) -> Page:
        """Up to `limit` requests matching `f` (and `keep`), after `cursor`.

        Reads index pages until the page is full, the index ends, or `max_scan` entries were
        read (then the page is short and its cursor goes on from the last entry read). Ids
        whose hash has expired are skipped.
        """
        indexes, rev = self.indexes_for(f)
        tag = indexes[0].removeprefix(self.store.keys.base(0))
        after = decode_cursor(cursor, tag) if cursor else None
        out: list[Request] = []
        scanned = 0
        batch = limit + 1 if keep is None else max(limit, 100)
        while True:
            entries = self._merged(indexes, rev, after, batch)
            by_id = {r.id: r for r in self.fetch([rid for rid, _ in entries])}
            for rid, score in entries:
                scanned += 1
                request = by_id.get(rid)
                if request is not None and f.matches(request) and (keep is None or keep(request)):
                    if len(out) == limit:  # one more exists: the page ends before it
                        return Page(out, encode_cursor(tag, *after) if after else None)
                    out.append(request)
                after = (score, rid)
            if len(entries) < batch:
                return Page(out, None)
            if len(out) == limit or scanned >= max_scan:
                assert after is not None  # a whole batch was read: `after` is its last entry
                return Page(out, encode_cursor(tag, *after))
