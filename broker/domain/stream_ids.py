"""Redis stream ids that come back from outside (event ids, cursors), read one way everywhere.

`GET /v1/events` resumes from a `Last-Event-ID`, `GET /v1/audit` pages on with a cursor; both
hold stream ids a client hands back, which Redis then reads as XREAD and XRANGE bounds. Redis
refuses an id whose part passes 2^64-1, one spelled in other digits than ASCII, and an
exclusive bound (`(ID`) from the very last id there can be (nothing follows it): each of those
was a Redis error, and a 500 or a broken stream, when it reached Redis. So every such id is
parsed here, before Redis sees it, and refused the same way wherever it comes in. Never
touches Redis.
"""

from __future__ import annotations

import re

MAX_PART = 2**64 - 1
"""The largest part of a stream id (`ms-seq`): both are unsigned 64-bit numbers in Redis."""

_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?", re.ASCII)


class BadStreamId(ValueError):
    """Text that is not a stream id this broker could have handed out."""


def parse_stream_id(text: str, *, seq: bool = True) -> tuple[int, int]:
    """`ms-seq` as two numbers; with `seq=False` the `-seq` may be left out (it is 0).

    Raises BadStreamId for anything else: other characters (a sign, a space, a newline,
    digits of another script), a part above 2^64-1, or the last id of all (2^64-1 twice),
    which no stream ever reaches and after which nothing can be read."""
    found = _ID.fullmatch(text)
    if found is None or (seq and found[2] is None):
        raise BadStreamId(f"not a stream id: {text[:60]!r}")
    ms, n = int(found[1]), int(found[2] or 0)
    if ms > MAX_PART or n > MAX_PART:
        raise BadStreamId(f"a stream id's parts are at most {MAX_PART}")
    if ms == n == MAX_PART:
        raise BadStreamId("the last stream id of all: nothing comes after it")
    return ms, n


def stream_id(text: str, *, seq: bool = True) -> str:
    """`text` checked by `parse_stream_id`, as Redis is given it (`ms-seq`, no leading zeros)."""
    ms, n = parse_stream_id(text, seq=seq)
    return f"{ms}-{n}"
