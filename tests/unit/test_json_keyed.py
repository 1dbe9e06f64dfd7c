"""broker.domain.json_keyed: one computation per distinct JSON value, errors never cached."""

from __future__ import annotations

import pytest

from broker.domain.json_keyed import cached_by_json, json_key


def test_equal_values_share_one_computation_and_other_values_get_their_own() -> None:
    calls: list[object] = []

    @cached_by_json()
    def size(value: object, where: str) -> int:
        calls.append(value)
        return len(value)  # type: ignore[arg-type]

    assert size({"a": 1, "b": 2}, "x") == 2
    assert size({"a": 1, "b": 2}, "x") == 2
    assert size({"b": 2, "a": 1}, "x") == 2  # another order is another key (errors name order)
    assert size({"a": 1, "b": 2}, "y") == 2  # the extra arguments are part of the key
    assert len(calls) == 3
    assert size.cache_info().hits == 1


def test_the_function_gets_a_copy_so_a_caller_mutating_its_value_changes_nothing() -> None:
    @cached_by_json()
    def keys(value: dict[str, int]) -> tuple[str, ...]:
        value["seen"] = 1  # would leak into the caller's dict if it were passed through
        return tuple(sorted(value))

    mine = {"a": 1}
    assert keys(mine) == ("a", "seen")
    assert mine == {"a": 1}


def test_a_value_json_cannot_encode_is_computed_every_time_uncached() -> None:
    calls = 0

    @cached_by_json()
    def name(value: object) -> str:
        nonlocal calls
        calls += 1
        return type(value).__name__

    assert json_key({1, 2}) is None
    assert name({1, 2}) == "set"
    assert name({1, 2}) == "set"
    assert calls == 2
    assert name.cache_info().currsize == 0


def test_an_error_is_raised_each_time_and_not_cached() -> None:
    calls = 0

    @cached_by_json()
    def refuse(value: object) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("no")

    for _ in range(2):
        with pytest.raises(ValueError, match="no"):
            refuse([1])
    assert calls == 2
