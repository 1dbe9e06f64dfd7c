"""A Lua step's arguments are encoded with orjson, as the stdlib wrote them (the steps read them
with cjson; some store parts verbatim), and what orjson refuses still goes as before."""

from __future__ import annotations

import json

from broker.store.script_keys import encode_args


def _stdlib(values: dict[str, object]) -> str:
    return json.dumps(values, ensure_ascii=False, separators=(",", ":"))


def test_step_args_are_the_same_text_the_stdlib_wrote() -> None:
    values: dict[str, object] = {
        "args": {"amount": 12.5, "to": "Zoë 🚀", "tags": ["a", 'b\n"c"'], "n": None},
        "quorum": 2,
        "ok": True,
        "k": ["ops", "finance"],
        "r": {"1": "x"},
        "big": 2**53,
        "at": 1765000000.123456,
    }
    assert encode_args(values) == _stdlib(values)


def test_step_args_orjson_refuses_go_through_the_stdlib() -> None:
    for values in ({"reason": "lone \ud800 surrogate"}, {"huge": 2**70}, {1: "int key"}):
        assert encode_args(values) == _stdlib(values)  # type: ignore[arg-type]
