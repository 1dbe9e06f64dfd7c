"""Redis replies as text: the broker's client does not decode, so this is the one place that does.

Undecodable bytes become U+FFFD rather than an exception: a malformed entry written by something
else must not crash the reader (it is reported, or dead-lettered, as what it is).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, overload

import orjson

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


def as_str_dict(raw: Mapping[bytes, bytes] | Mapping[str, str] | None) -> dict[str, str]:
    """A hash or stream entry (HGETALL, XRANGE fields) as a dict of str.

    Decoded in one comprehension when every key and value is bytes (a Redis reply: what the
    notifier and the API parse per request); text, or a mix, goes item by item."""
    if not raw:
        return {}
    try:
        return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}  # type: ignore[union-attr]
    except AttributeError:  # already text (or mixed)
        return {as_str(k): as_str(v) for k, v in raw.items()}


def json_loads(text: str) -> Any:
    """Stored JSON, decoded by orjson; by `json` where orjson refuses it or might read an
    integer past 64 bits as a float (any run of 19 digits, in a number or not: slower, exact)."""
    if _MAYBE_PAST_64_BITS.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)
