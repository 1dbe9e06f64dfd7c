"""Schemas and questions a create checks are checked once per distinct value in a process, and
a bad one is refused every time (a refusal is never remembered as a pass)."""

from __future__ import annotations

import pytest

from broker.domain import answer_schema, args_schema, questions, schema_safety
from broker.domain.errors import InvalidInput


def counting(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(owner, name)

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_an_args_schema_is_checked_once_and_its_validator_compiled_once(monkeypatch):
    schema = {"type": "object", "properties": {"amount_unique_1": {"type": "number"}}}
    checks = counting(monkeypatch, schema_safety, "check_schema")
    for _ in range(3):
        args_schema.check_schema(dict(schema))
    assert len(checks) == 1
    misses = schema_safety.compiled.cache_info().misses
    args_schema.check_args(schema, {"amount_unique_1": 3})
    with pytest.raises(InvalidInput) as caught:
        args_schema.check_args(dict(schema), {"amount_unique_1": "three"})
    assert caught.value.code == "invalid_args"
    assert schema_safety.compiled.cache_info().misses - misses == 1  # compiled for the first only


def test_a_bad_args_schema_is_refused_every_time():
    for _ in range(2):
        with pytest.raises(InvalidInput) as caught:
            args_schema.check_schema({"type": "array", "x_unique_2": 1})
        assert caught.value.code == "invalid_schema"


def test_questions_and_answer_schemas_are_parsed_once(monkeypatch):
    raw = [
        {
            "question": "Which one, unique 3?",
            "header": "Pick",
            "options": [{"label": "a"}, {"label": "b"}],
        }
    ]
    first = questions.parse_questions(raw)
    again = questions.parse_questions([dict(raw[0])])
    assert first == again and first is not again
    assert questions._parsed.cache_info().hits >= 1
    schema = {"type": "object", "properties": {"title_unique_4": {"type": "string"}}}
    checks = counting(monkeypatch, answer_schema, "_check_schema")
    assert answer_schema.check_schema(schema) == answer_schema.check_schema(dict(schema))
    assert len(checks) == 1
    for _ in range(2):
        with pytest.raises(InvalidInput):
            questions.parse_questions([{"question": "no options"}])
