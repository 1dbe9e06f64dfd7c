"""Hypothesis strategies for JSON an attacker sends: any value, near-valid objects with a field of
the wrong type, numbers past 64 bits, non-finite floats, odd Unicode, and text that is JSON
only in part or nested far past any bound. Shared by the fuzz suites of each inbound surface."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

ODD_TEXT = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "\u202e",
        "\u200b",
        "\ud800",  # a lone surrogate: not valid Unicode
        "a" * 10_001,
        "../../etc/passwd",
        "%00",
        "webhook:ops",
        "admin",
        "*",
        "\u0661\u0662",  # Arabic-Indic digits
        "1e400",
        "18446744073709551616",
    ]
)
TEXT = st.one_of(st.text(max_size=40), ODD_TEXT)
UNICODE_TEXT = TEXT.filter(lambda t: not any("\ud800" <= c <= "\udfff" for c in t))
"""TEXT that is valid Unicode (what a client must encode as UTF-8 before sending it)."""
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**64 + 2),
    st.sampled_from([-(2**64), 10**30, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
)


def json_values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """Any JSON value with strings and keys from `text` (NaN and Infinity included, which
    `json.dumps` writes and JSON forbids)."""
    scalars = st.one_of(st.none(), st.booleans(), NUMBERS, text)
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)
        ),
        max_leaves=12,
    )


VALUES = json_values(TEXT)
UNICODE_VALUES = json_values(UNICODE_TEXT)
"""VALUES a client can send as UTF-8 (the MCP SDK's client can't encode a lone surrogate)."""


def near(
    valid: dict[str, Any], extra_keys: bool = True, values: st.SearchStrategy[Any] = VALUES
) -> st.SearchStrategy[dict[str, Any]]:
    """`valid` with some of its fields swapped for hostile `values`, dropped, or added to."""
    fields = {k: st.one_of(st.just(v), values) for k, v in valid.items()}
    base = st.fixed_dictionaries({}, optional=fields)
    if not extra_keys:
        return base
    keys = UNICODE_TEXT if values is UNICODE_VALUES else TEXT
    return st.tuples(base, st.dictionaries(keys, values, max_size=2)).map(
        lambda pair: {**pair[1], **pair[0]}
    )


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


HOSTILE_BODIES = [
    "",
    "{",
    "null",
    "[]",
    '"text"',
    nested(2000),
    '{"a":' * 300 + "1" + "}" * 300,
    "9" * 5000,
    '{"request_id": ' + "9" * 5000 + "}",
    "NaN",
    '{"a": 1e999999}',
    '{"a": "\\ud800"}',
    '{"a": 1, "a": 2}',
]
"""Bodies as text that JSON parsers disagree on, refuse, or recurse into: each suite sends
every one of them as well as what it generates (a sample might not draw the one that fails)."""
RAW_TEXT = st.one_of(st.sampled_from(HOSTILE_BODIES), st.text(max_size=60))


def hostile_variants(body: dict[str, Any]) -> list[str]:
    """`body` as text with each field in turn nested 2,000 deep, a 5,000-digit number, NaN."""
    out = []
    for key in body:
        for value in (nested(2000), "9" * 5000, "NaN", "-1e999"):
            out.append(json.dumps({**body, key: "HOSTILE"}).replace('"HOSTILE"', value))
    return out


def dumps(value: Any) -> str:
    """`value` as JSON text, lone surrogates and all (`ensure_ascii` escapes them)."""
    return json.dumps(value)
