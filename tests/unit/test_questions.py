"""Structured questions: what a request may ask, which answers count, and what the model reads."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from broker.domain.errors import InvalidInput
from broker.domain.questions import (
    InvalidAnswer,
    answer_text,
    has_form,
    is_structured,
    questions_of,
    validate_answer,
    validate_question_metadata,
)

AUTH = {
    "question": "Which auth method?",
    "header": "Auth",
    "context": "The API is public.",
    "multi_select": False,
    "options": [
        {
            "label": "OAuth 2.0",
            "description": "Tokens from the IdP",
            "preview": "Authorization: Bearer",
        },
        {"label": "API key"},
    ],
}
FEATURES = {
    "question": "Which features ship first?",
    "header": "Features",
    "multi_select": True,
    "options": [{"label": "SSO"}, {"label": "Audit log"}, {"label": "Exports"}],
}
QUESTIONS = {"questions": [AUTH, FEATURES]}
SCHEMA = {
    "answer_schema": {
        "type": "object",
        "title": "Shipping",
        "properties": {
            "size": {"type": "integer", "title": "Size", "minimum": 1},
            "colour": {"enum": ["red", "blue"], "default": "red", "description": "Paint"},
            "extras": {"type": "array", "items": {"enum": ["gift wrap", "insurance"]}},
            "rush": {"type": "boolean", "title": "Rush delivery"},
            "note": {"type": "string", "maxLength": 20},
            "price": {"type": "number"},
        },
        "required": ["size"],
    }
}


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(changes)
    return out


def refused(metadata: dict[str, Any], kind: str | None = None) -> str:
    with pytest.raises(InvalidInput) as caught:
        validate_question_metadata(metadata, kind)
    assert caught.value.code == "invalid_question"
    return caught.value.detail


# --- the questions a request may carry ----------------------------------------------------


def test_well_formed_questions_and_schemas_are_accepted() -> None:
    validate_question_metadata(QUESTIONS)
    validate_question_metadata({"questions": [AUTH]}, "question")
    validate_question_metadata(SCHEMA, "question")
    validate_question_metadata({"prompt": "no form at all"}, "approval")
    assert [q.header for q in questions_of(QUESTIONS) or []] == ["Auth", "Features"]
    assert is_structured(SCHEMA) and is_structured(QUESTIONS)
    assert not is_structured({"options": ["a", "b"]})


def test_multi_select_defaults_to_single_choice() -> None:
    q = with_(AUTH)
    del q["multi_select"]
    [parsed] = questions_of({"questions": [q]}) or []
    assert parsed.multi_select is False


@pytest.mark.parametrize(
    ("metadata", "detail"),
    [
        ({"questions": [AUTH] * 5}, "metadata.questions: 1 to 4 questions, not 5"),
        ({"questions": []}, "metadata.questions: 1 to 4 questions, not 0"),
        ({"questions": "Which?"}, "metadata.questions: must be a list of questions"),
        (
            {"questions": [AUTH, with_(FEATURES, header="Features list")]},
            "metadata.questions[1].header: at most 12 characters",
        ),
        (
            {"questions": [with_(AUTH, options=[{"label": "Only one"}])]},
            "metadata.questions[0].options: at least 2 items",
        ),
        (
            {"questions": [with_(AUTH, options=[{"label": str(n)} for n in range(5)])]},
            "metadata.questions[0].options: at most 4 items",
        ),
        (
            {"questions": [AUTH, with_(FEATURES, options=[{"label": "SSO"}, {"label": "SSO"}])]},
            "metadata.questions[1].options: duplicate label 'SSO'",
        ),
        (
            {"questions": [with_(AUTH, header="")]},
            "metadata.questions[0].header: must not be empty",
        ),
        (
            {"questions": [with_(AUTH, options=[{"label": ""}, {"label": "b"}])]},
            "metadata.questions[0].options[0].label: must not be empty",
        ),
        (
            {"questions": [{k: v for k, v in AUTH.items() if k != "question"}]},
            "metadata.questions[0].question: is required",
        ),
        (
            {"questions": [with_(AUTH, multiSelect=True)]},
            "metadata.questions[0].multiSelect: unknown field",
        ),
        (
            {"questions": [with_(AUTH, multi_select="yes")]},
            "metadata.questions[0].multi_select: Input should be a valid boolean",
        ),
        ({"questions": [AUTH, AUTH]}, "metadata.questions[1].question: the same as question 0"),
        (
            {"questions": [AUTH], "answer_schema": SCHEMA["answer_schema"]},
            "metadata: give either questions or answer_schema, not both",
        ),
    ],
)
def test_malformed_questions_are_refused_naming_the_field(
    metadata: dict[str, Any], detail: str
) -> None:
    assert refused(metadata) == detail


def test_only_a_question_request_may_carry_a_form() -> None:
    assert refused(QUESTIONS, "approval") == (
        "metadata.questions: only a question request may carry questions (this one is 'approval')"
    )
    assert refused(SCHEMA, "external").startswith("metadata.answer_schema: only a question")


def schema(**props: Any) -> dict[str, Any]:
    return {"answer_schema": {"type": "object", "properties": props}}


@pytest.mark.parametrize(
    ("metadata", "detail"),
    [
        (
            {"answer_schema": {"type": "object", "properties": {"a": {"type": "strnig"}}}},
            "metadata.answer_schema.properties.a.type: not a valid JSON Schema",
        ),
        (
            {"answer_schema": {"type": "object", "required": "a"}},
            "metadata.answer_schema.required: not a valid JSON Schema: 'a' is not of type 'array'",
        ),
        ({"answer_schema": "a string"}, "metadata.answer_schema: must be a JSON Schema object"),
        (
            {"answer_schema": {"type": "array", "items": {"type": "string"}}},
            "metadata.answer_schema: unsupported keyword 'items'",
        ),
        (
            {"answer_schema": {"type": "string"}},
            "metadata.answer_schema.type: must be 'object'",
        ),
        (
            {"answer_schema": {"type": "object", "properties": {}}},
            "metadata.answer_schema.properties: must name at least one field",
        ),
        (
            schema(address={"type": "object", "properties": {"city": {"type": "string"}}}),
            "metadata.answer_schema.properties.address: unsupported type 'object'",
        ),
        (
            schema(when={"type": "null"}),
            "metadata.answer_schema.properties.when: unsupported type 'null'",
        ),
        (
            schema(a={"anyOf": [{"type": "string"}, {"type": "integer"}]}),
            "metadata.answer_schema.properties.a: unsupported 'anyOf'",
        ),
        (
            schema(a={"$ref": "#/$defs/A"}),
            "metadata.answer_schema.properties.a: unsupported '$ref'",
        ),
        (
            schema(tags={"type": "array", "items": {"type": "string"}}),
            "metadata.answer_schema.properties.tags: an array must have 'items' with an 'enum'",
        ),
        (
            schema(a={"enum": [True, False]}),
            "metadata.answer_schema.properties.a.enum: choices must be strings or numbers",
        ),
        (
            schema(a={"enum": ["x", "x"]}),
            "metadata.answer_schema.properties.a.enum: choices must be unique",
        ),
        (
            schema(a={"type": "string", "enum": ["x", 2]}),
            "metadata.answer_schema.properties.a.enum: 2 is not of type 'string'",
        ),
        (
            schema(a={"type": "array", "items": {"type": "integer", "enum": [1, 2.5]}}),
            "metadata.answer_schema.properties.a.items.enum: 2.5 is not of type 'integer'",
        ),
        (
            schema(a={"type": "string", "default": 3}),
            "metadata.answer_schema.properties.a.default: 3 is not of type 'string'",
        ),
        (
            schema(a={"type": "string", "const": "x"}),
            "metadata.answer_schema.properties.a: unsupported keyword 'const'",
        ),
        (
            schema(a={"description": "no type"}),
            "metadata.answer_schema.properties.a: needs a 'type'",
        ),
        (
            {
                "answer_schema": {
                    "type": "object",
                    "properties": {"a": {"type": "string"}},
                    "required": ["b"],
                }
            },
            "metadata.answer_schema.required: 'b' is not one of the properties",
        ),
    ],
)
def test_unsupported_or_invalid_schemas_are_refused_naming_the_field(
    metadata: dict[str, Any], detail: str
) -> None:
    assert refused(metadata).startswith(detail)


def test_a_schema_naming_an_older_draft_is_checked_and_applied_as_that_draft() -> None:
    draft7 = {
        "answer_schema": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}},
        }
    }
    validate_question_metadata(draft7)
    assert validate_answer(draft7, {"n": 1}) == {"n": 1}
    with pytest.raises(InvalidAnswer, match="answer.n: 0 is less than or equal to the minimum"):
        validate_answer(draft7, {"n": 0})
    bad = copy.deepcopy(draft7)
    bad["answer_schema"]["properties"]["n"]["exclusiveMinimum"] = True  # draft-04 style
    assert refused(bad).startswith(
        "metadata.answer_schema.properties.n.exclusiveMinimum: not a valid JSON Schema"
    )


def test_has_form_is_false_for_malformed_stored_metadata() -> None:
    assert has_form(QUESTIONS) and has_form(SCHEMA)
    assert not has_form({"questions": [with_(AUTH, header="far too long a header")]})
    assert not has_form({"prompt": "plain"})


# --- answers to questions -----------------------------------------------------------------


def answer(*items: dict[str, Any]) -> dict[str, Any]:
    return {"answers": list(items)}


def test_a_fitting_answer_is_normalised_to_the_questions_order() -> None:
    given = answer(
        {"question": "Which features ship first?", "selected": ["Exports", "SSO"], "other": " "},
        {"question": "Which auth method?", "selected": [], "other": " SAML "},
    )
    assert validate_answer(QUESTIONS, given) == answer(
        {"question": "Which auth method?", "selected": [], "other": "SAML"},
        {"question": "Which features ship first?", "selected": ["SSO", "Exports"], "other": None},
    )


def test_multi_select_takes_several_options_and_other_together() -> None:
    given = answer(
        {"question": "Which auth method?", "selected": ["API key"]},
        {
            "question": "Which features ship first?",
            "selected": ["SSO", "Audit log", "Exports"],
            "other": "Webhooks",
        },
    )
    out = validate_answer(QUESTIONS, given)
    assert out["answers"][1] == {
        "question": "Which features ship first?",
        "selected": ["SSO", "Audit log", "Exports"],
        "other": "Webhooks",
    }
    assert out["answers"][0]["other"] is None


def rejected(metadata: dict[str, Any], value: Any) -> InvalidAnswer:
    with pytest.raises(InvalidAnswer) as caught:
        validate_answer(metadata, value)
    assert caught.value.code == "invalid_answer"
    assert isinstance(caught.value, InvalidInput)  # the API's 422
    return caught.value


FEAT_OK = {"question": "Which features ship first?", "selected": ["SSO"]}


@pytest.mark.parametrize(
    ("value", "detail", "question"),
    [
        (
            answer({"question": "Which auth method?", "selected": ["SAML"]}, FEAT_OK),
            "answer.answers[0].selected: 'SAML' is not an option of 'Which auth method?' "
            "(options: OAuth 2.0, API key)",
            0,
        ),
        (
            answer(
                {"question": "Which auth method?", "selected": ["OAuth 2.0", "API key"]}, FEAT_OK
            ),
            "answer.answers[0]: 'Which auth method?' takes one choice (an option or 'other'), not 2",
            0,
        ),
        (
            answer(
                {"question": "Which auth method?", "selected": ["API key"], "other": "SAML"},
                FEAT_OK,
            ),
            "answer.answers[0]: 'Which auth method?' takes one choice (an option or 'other'), not 2",
            0,
        ),
        (answer(FEAT_OK), "answer.answers: no answer to 'Which auth method?'", 0),
        (
            answer(FEAT_OK, {"question": "Which auth method?", "selected": [], "other": None}),
            "answer.answers[1]: 'Which auth method?' is not answered "
            "(choose an option or write 'other')",
            0,
        ),
        (
            answer({"question": "Which auth method?", "selected": ["API key"]}, FEAT_OK, FEAT_OK),
            "answer.answers[2]: 'Which features ship first?' is answered twice",
            None,
        ),
        (
            answer({"question": "Which colour?", "selected": ["red"]}),
            "answer.answers[0].question: 'Which colour?' is not one of the questions",
            None,
        ),
        (
            answer(
                {"question": "Which auth method?", "selected": ["API key"]},
                {"question": "Which features ship first?", "selected": ["SSO", "SSO"]},
            ),
            "answer.answers[1].selected: an option is chosen twice",
            1,
        ),
        (
            answer(
                {"question": "Which auth method?", "other": "x" * 2001},
                FEAT_OK,
            ),
            "answer.answers[0].other: at most 2000 characters",
            0,
        ),
        ("OAuth 2.0", "answer: must be an object", None),
        ({"answer": []}, "answer.answers: is required", None),
        ({"answers": "SSO"}, "answer.answers: must be a list", None),
        (
            answer({"question": "Which auth method?", "selected": "API key"}),
            "answer.answers[0].selected: must be a list",
            None,
        ),
        (
            answer({"question": "Which auth method?", "chosen": ["API key"]}),
            "answer.answers[0].chosen: unknown field",
            None,
        ),
    ],
)
def test_answers_that_do_not_fit_are_refused_naming_what_is_wrong(
    value: Any, detail: str, question: int | None
) -> None:
    error = rejected(QUESTIONS, value)
    assert error.detail == detail
    assert error.question == question


# --- answers to a schema ------------------------------------------------------------------


def test_a_schema_answer_gets_its_defaults() -> None:
    out = validate_answer(SCHEMA, {"size": 3, "extras": ["insurance"], "rush": True})
    assert out == {"size": 3, "extras": ["insurance"], "rush": True, "colour": "red"}


@pytest.mark.parametrize(
    ("value", "detail", "problems"),
    [
        (
            {"size": "big"},
            "answer.size: 'big' is not of type 'integer'",
            {"size": "'big' is not of type 'integer'"},
        ),
        ({}, "answer: 'size' is a required property", {"size": "required"}),
        (
            {"size": 0},
            "answer.size: 0 is less than the minimum of 1",
            {"size": "0 is less than the minimum of 1"},
        ),
        (
            {"size": 1, "colour": "green", "extras": ["glitter"]},
            "answer.colour: 'green' is not one of ['red', 'blue']; "
            "answer.extras[0]: 'glitter' is not one of ['gift wrap', 'insurance']",
            {
                "colour": "'green' is not one of ['red', 'blue']",
                "extras": "'glitter' is not one of ['gift wrap', 'insurance']",
            },
        ),
        ({"size": 1, "note": "x" * 21}, "answer.note: ", {"note": None}),
        ({"size": 1, "rush": "yes"}, "answer.rush: 'yes' is not of type 'boolean'", None),
        ([3], "answer: must be an object of fields, not list", {}),
    ],
)
def test_schema_answers_that_do_not_fit_are_refused(
    value: Any, detail: str, problems: dict[str, Any] | None
) -> None:
    error = rejected(SCHEMA, value)
    assert error.detail.startswith(detail)
    if problems is not None:
        assert set(error.problems) == set(problems)
        for name, problem in problems.items():
            if problem is not None:
                assert error.problems[name] == problem
        assert error.field == next(iter(problems), None)


def test_a_request_without_a_form_takes_any_answer() -> None:
    assert validate_answer({"prompt": "free text"}, {"anything": [1]}) == {"anything": [1]}
    assert validate_answer({}, "42") == "42"


# --- what the model reads -----------------------------------------------------------------


def test_answer_text_is_one_line_per_question() -> None:
    normalised = validate_answer(
        QUESTIONS,
        answer(
            {"question": "Which auth method?", "selected": ["OAuth 2.0"]},
            {"question": "Which features ship first?", "selected": ["SSO"], "other": "Webhooks"},
        ),
    )
    assert answer_text(QUESTIONS, normalised) == (
        "Which auth method? OAuth 2.0\nWhich features ship first? SSO, Other: Webhooks"
    )


def test_answer_text_joins_a_question_without_a_question_mark_with_a_colon() -> None:
    q = with_(AUTH, question="Pick an auth method")
    metadata = {"questions": [q]}
    value = validate_answer(metadata, answer({"question": "Pick an auth method", "other": "mTLS"}))
    assert answer_text(metadata, value) == "Pick an auth method: Other: mTLS"


def test_answer_text_of_a_schema_answer_is_label_and_value_per_field() -> None:
    value = validate_answer(
        SCHEMA, {"size": 3, "extras": ["gift wrap", "insurance"], "rush": False, "price": 9.5}
    )
    assert answer_text(SCHEMA, value) == (
        "Size: 3\ncolour: red\nextras: gift wrap, insurance\nRush delivery: no\nprice: 9.5"
    )


def test_answer_text_never_fails_on_an_answer_that_was_not_checked() -> None:
    assert answer_text(QUESTIONS, "just text") == "just text"
    assert answer_text(QUESTIONS, {"answers": "nope"}) == '{"answers": "nope"}'
    assert answer_text(SCHEMA, {}) == "{}"
    assert answer_text({}, {"a": 1}) == '{"a": 1}'
