"""Redis replies as text: the broker's client does not decode, so this is the one place that does
(and text as redis-py's commands are typed to take it).

Undecodable bytes become U+FFFD rather than an exception: a malformed entry written by something
else must not crash the reader (it is reported, or dead-lettered, as what it is).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, cast, overload

import orjson
from redis.typing import (
    EncodableT,
    FieldT,
    KeyT,
    StreamIdT,
    XPendingRangeResponse,
    XReadGroupResponse,
    XReadResponse,
    ZSetRangeResponse,
)

_MAYBE_PAST_64_BITS = re.compile(r"[0-9]{19}")
"""A run of 19 digits: an integer that may be past 64 bits, which orjson reads as a float (ASCII
digits, the only ones a JSON number has: `\\d` also tries every Unicode digit, and its scan
took 1.3-1.5 times as long per read, timeit on an args and a history text)."""


@overload
def as_str(value: bytes | str) -> str: ...
@overload
def as_str(value: None) -> None: ...
def as_str(value: bytes | str | None) -> str | None:
    """A Redis reply (bytes) as str; str and None pass through."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


Fields = Mapping[bytes, bytes] | Mapping[str, str] | Mapping[bytes | str, bytes | str]
"""A hash or a stream entry's fields as a reply holds them: redis-py types a reply `bytes | str`
(a client with `decode_responses` gives str), the broker's clients give bytes, a test's text."""


@overload
def as_bytes(value: bytes | str) -> bytes: ...
@overload
def as_bytes(value: None) -> None: ...
def as_bytes(value: bytes | str | None) -> bytes | None:
    """A Redis reply kept as bytes (what the broker's clients give); str is encoded, None passes."""
    return value.encode() if isinstance(value, str) else value


Entry = tuple[bytes, dict[bytes, bytes]]
"""A new stream entry as the broker's clients read it: its id and its fields."""

Streams = list[tuple[bytes, list[Entry]]]
"""XREAD's or XREADGROUP's reply (reading new entries): each stream that had some, with them."""


class Pending(TypedDict):
    """One row of XPENDING's extended form (`xpending_range`)."""

    message_id: bytes
    consumer: bytes
    time_since_delivered: int
    times_delivered: int


def as_positions(cursor: dict[str, str]) -> dict[KeyT, StreamIdT]:
    """A cursor (stream -> the last id read) as redis-py types what XREAD takes: the same dict
    (a dict's key and value types are invariant to a type checker)."""
    return cast("dict[KeyT, StreamIdT]", cursor)


def as_streams(reply: XReadResponse | XReadGroupResponse | None) -> Streams:
    """An XREAD or XREADGROUP reply as what it is on the broker's clients (no
    `decode_responses`, RESP2): a list of (stream, entries); None (nothing came in time) as [].
    redis-py types the reply of every protocol and option at once."""
    return cast(Streams, reply or [])


def as_pending(reply: XPendingRangeResponse) -> list[Pending]:
    """An `xpending_range` reply as what it is on the broker's clients: rows of bytes and ints."""
    return cast(list[Pending], reply)


def as_members(reply: ZSetRangeResponse) -> list[bytes | str]:
    """A ZRANGE reply read without scores, as what it is: its members. redis-py types every
    ZRANGE reply with the scored shapes too (WITHSCORES), whichever was asked for."""
    return cast("list[bytes | str]", reply)


def as_str_dict(raw: Fields | None) -> dict[str, str]:
    """A hash or stream entry (HGETALL, XRANGE fields) as a dict of str.

    Decoded in one comprehension when every key and value is bytes (a Redis reply: what the
    notifier and the API parse per request); text, or a mix, goes item by item."""
    if not raw:
        return {}
    try:
        return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}  # type: ignore[union-attr]  # a str raises AttributeError: the path below
    except AttributeError:  # already text (or mixed)
        return {as_str(k): as_str(v) for k, v in raw.items()}


def as_hash(flat: Sequence[Any]) -> dict[Any, Any]:
    """A hash a Lua step replies with (its HGETALL: field, value, field, value...) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def json_loads(text: str) -> Any:
    """Stored JSON, decoded by orjson; by `json` where orjson refuses it or might read an
    integer past 64 bits as a float (any run of 19 digits, in a number or not: slower, exact)."""
    if _MAYBE_PAST_64_BITS.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def as_fields(fields: dict[str, str]) -> dict[FieldT, EncodableT]:
    """`fields` as redis-py types what HSET and XADD take: the same dict. Every str is a `FieldT`
    and an `EncodableT`, but a dict's key and value types are invariant to a type checker."""
    return cast("dict[FieldT, EncodableT]", fields)
