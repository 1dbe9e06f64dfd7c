"""JSON from outside, parsed within bounds: a size cap before parsing, a depth cap after.

Every body, payload and cursor the broker reads from a client, Slack, an email form or a
webhook endpoint goes through `loads` (or `check`, for a value a framework already parsed), so
a document nested thousands deep or a megabyte where a few hundred bytes belong is a clear
`TooLarge` / `TooDeep` (both `InvalidInput`, HTTP 422) instead of a `RecursionError`, a 500 or
a slow walk later. The depth is measured without recursion. orjson parses (it refuses NaN and
Infinity, and stops at its own nesting limit with an error, never a crash); text that may
hold an integer past 64 bits, which orjson reads as a float, is read by `json` once its depth
is known to be in bounds. Nothing here knows a route or a channel.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from broker.domain.errors import InvalidInput

MAX_DEPTH = 64
"""Arrays and objects inside one another: no payload the broker reads needs more than a few."""
MAX_BYTES = 1024 * 1024
"""The API's body limit: a document larger than this is refused before it is parsed."""


_MAYBE_PAST_64_BITS = re.compile(rb"[0-9]{19}")
"""A run of 19 digits: an integer orjson would read as a float (as `broker.redis.replies` says)."""


class TooDeep(InvalidInput):
    """A JSON document nested deeper than its bound."""

    code = "too_deep"


class TooLarge(InvalidInput):
    """A JSON document larger than its bound."""

    code = "too_large"


def depth_of(value: Any, limit: int | None = None) -> int:
    """How deeply arrays and objects nest in `value` (a scalar: 0), without recursion.

    With `limit`, the walk stops as soon as the depth passes it (the result is then limit+1)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if limit is not None and deepest > limit:
                return deepest
        stack.extend((child, depth) for child in children if isinstance(child, dict | list | tuple))
    return deepest


def _scan_depth(raw: bytes, limit: int) -> int:
    """The bracket depth of JSON text, strings skipped: orjson's limit is 1024 and `json`'s is
    the interpreter's recursion limit, so text that may be deep is measured before `json` reads
    it. Linear, in C-speed slices (`bytes.find`) between brackets and quotes."""
    depth = deepest = 0
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == 0x22:  # a string: skip to its closing quote (an escaped one doesn't count)
            i += 1
            while True:
                j = raw.find(b'"', i)
                if j < 0:
                    return deepest
                k = j
                while k > i and raw[k - 1] == 0x5C:
                    k -= 1
                i = j + 1
                if (j - k) % 2 == 0:
                    break
            continue
        if c in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif c in (0x5D, 0x7D):
            depth -= 1
        i += 1
    return deepest


def check(value: Any, what: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """`value` (already parsed, e.g. by a framework) if it nests at most `max_depth`; else TooDeep."""
    if depth_of(value, max_depth) > max_depth:
        raise TooDeep(f"{what}: nested more than {max_depth} deep")
    return value


def loads(
    raw: bytes | str, what: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """JSON text from outside as Python values, within `max_bytes` and `max_depth`.

    Raises TooLarge, TooDeep, or InvalidInput (`invalid_json`) for text that isn't JSON;
    `what` names the input in the message (`payload`, `cursor`, `body`)."""
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > max_bytes:
        raise TooLarge(f"{what}: {len(data)} bytes; at most {max_bytes}")
    exact = _MAYBE_PAST_64_BITS.search(data) is not None  # orjson would read a float
    if not exact:
        try:
            return check(orjson.loads(data), what, max_depth=max_depth)
        except orjson.JSONDecodeError:
            pass  # not JSON, or past orjson's own nesting limit: say which
    if _scan_depth(data, max_depth) > max_depth:
        raise TooDeep(f"{what}: nested more than {max_depth} deep")
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidInput(f"{what}: not valid JSON", code="invalid_json") from None
    return check(value, what, max_depth=max_depth)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
