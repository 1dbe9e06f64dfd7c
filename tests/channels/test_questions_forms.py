"""Reading a structured answer from an HTML form post (email page, inbox) and placing its errors."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.datastructures import FormData

from broker.domain.questions import InvalidAnswer, validate_answer
from channels.answer_forms import answer_from_form, error_inputs

pytestmark = pytest.mark.unit  # no Redis, no server: tests/conftest.py runs these last

QUESTIONS = {
    "questions": [
        {
            "question": "Which auth method?",
            "header": "Auth",
            "options": [{"label": "OAuth 2.0"}, {"label": "API key"}],
        },
        {
            "question": "Which scopes?",
            "header": "Scopes",
            "multi_select": True,
            "options": [{"label": "read"}, {"label": "write"}, {"label": "admin"}],
        },
    ]
}
SCHEMA = {
    "answer_schema": {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "hours": {"type": "number", "maximum": 40},
            "count": {"type": "integer", "default": 1},
            "priority": {"enum": ["low", "high"]},
            "labels": {"type": "array", "items": {"enum": ["ui", "api"]}, "default": ["api"]},
            "urgent": {"type": "boolean"},
        },
        "required": ["title"],
    }
}


def test_a_multi_valued_form_post_reads_as_a_contract_answer() -> None:
    form = FormData(
        [("q0", "1"), ("q1", "0"), ("q1", "2"), ("q1_other", " billing "), ("q0_other", "")]
    )
    answer = answer_from_form(QUESTIONS, form)
    assert validate_answer(QUESTIONS, answer) == {
        "answers": [
            {"question": "Which auth method?", "selected": ["API key"], "other": None},
            {"question": "Which scopes?", "selected": ["read", "admin"], "other": "billing"},
        ]
    }


def test_a_schema_form_post_reads_typed_values() -> None:
    form = FormData(
        [
            ("field:title", "Login fails"),
            ("field:hours", "2.5"),
            ("field:count", ""),
            ("field:priority", "1"),
            ("field:labels", ""),  # the hidden marker: the boxes were shown
            ("field:labels", "0"),
            ("field:urgent", "false"),
        ]
    )
    answer = answer_from_form(SCHEMA, form)
    assert answer == {
        "title": "Login fails",
        "hours": 2.5,
        "priority": "high",
        "labels": ["ui"],
        "urgent": False,
    }
    assert validate_answer(SCHEMA, answer)["count"] == 1  # left empty: the default


def test_unchecked_boxes_count_as_none_only_when_the_form_says_it_showed_them() -> None:
    shown = answer_from_form(SCHEMA, {"field:title": "x", "field:labels": [""]})
    assert shown["labels"] == []
    absent = answer_from_form(SCHEMA, {"field:title": "x"})
    assert "labels" not in absent
    assert validate_answer(SCHEMA, absent)["labels"] == ["api"]


@pytest.mark.parametrize(
    ("form", "problem"),
    [
        ({"field:priority": "5"}, {"field:priority": "not one of the choices"}),
        ({"field:priority": ["0", "1"]}, {"field:priority": "one value only"}),
        ({"field:urgent": "on"}, {"field:urgent": "not one of the choices"}),
        ({"field:count": "1.5"}, {"field:count": "must be a whole number"}),
        ({"field:hours": "nan"}, {"field:hours": "'nan' is not a number"}),
    ],
)
def test_values_no_form_of_ours_sends_are_refused(
    form: dict[str, Any], problem: dict[str, str]
) -> None:
    with pytest.raises(InvalidAnswer) as caught:
        answer_from_form(SCHEMA, {"field:title": "x", **form})
    assert error_inputs(caught.value, SCHEMA) == problem


def test_errors_are_placed_beside_their_inputs() -> None:
    with pytest.raises(InvalidAnswer) as caught:
        validate_answer(QUESTIONS, answer_from_form(QUESTIONS, {"q0": "0", "q0_other": "SAML"}))
    assert error_inputs(caught.value, QUESTIONS) == {
        "q0": "'Which auth method?' takes one choice (an option or 'other'), not 2"
    }
    with pytest.raises(InvalidAnswer) as caught:
        validate_answer(
            QUESTIONS, {"answers": [{"question": "Which auth method?", "other": "x" * 2001}]}
        )
    assert error_inputs(caught.value, QUESTIONS) == {"q0_other": "at most 2000 characters"}
    with pytest.raises(InvalidAnswer) as caught:
        validate_answer(SCHEMA, answer_from_form(SCHEMA, {"field:hours": "41"}))
    assert error_inputs(caught.value, SCHEMA) == {
        "field:title": "required",
        "field:hours": "41 is greater than the maximum of 40",
    }
    whole = InvalidAnswer("answer: must be an object")
    assert error_inputs(whole, SCHEMA) == {"field:title": "answer: must be an object"}
    assert error_inputs(whole, QUESTIONS) == {"q0": "answer: must be an object"}
