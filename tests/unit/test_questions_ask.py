"""Tool-author helpers: `ask`, `ask_for`, `schema_for`, `parse_answer`."""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field
from pydantic_ai import CallDeferred

from broker.ask import ask, ask_for, parse_answer, question, schema_for
from broker.domain.errors import InvalidInput
from broker.domain.questions import InvalidAnswer, Option, Question, validate_answer
from broker.domain.questions import validate_question_metadata as validate


def deferred(call: Any, *args: Any, **kwargs: Any) -> CallDeferred:
    with pytest.raises(CallDeferred) as caught:
        call(*args, **kwargs)
    return caught.value


def test_ask_defers_as_a_question_with_well_formed_questions_and_routing() -> None:
    exc = deferred(
        ask,
        [
            question("Which auth method?", "Auth", ["OAuth 2.0", Option(label="API key")]),
            Question(
                question="Which scopes?",
                header="Scopes",
                multi_select=True,
                options=[Option(label="read", preview="GET /things"), Option(label="write")],
            ),
        ],
        queue="security",
        timeout_s=60,
        allowed_roles=["security"],
    )
    assert exc.kind == "question"
    assert exc.metadata == {
        "questions": [
            {
                "question": "Which auth method?",
                "header": "Auth",
                "multi_select": False,
                "options": [{"label": "OAuth 2.0"}, {"label": "API key"}],
            },
            {
                "question": "Which scopes?",
                "header": "Scopes",
                "multi_select": True,
                "options": [{"label": "read", "preview": "GET /things"}, {"label": "write"}],
            },
        ],
        "prompt": "Which auth method?\nWhich scopes?",
        "queue": "security",
        "timeout_s": 60,
        "allowed_roles": ["security"],
    }
    validate(exc.metadata, "question")  # what the broker checks again when the request is made


def test_ask_keeps_a_given_prompt_and_context() -> None:
    q = question("Ship?", "Ship", ["yes", "no"], context="Friday deploy")
    exc = deferred(ask, [q], prompt="Release 1.2")
    assert exc.metadata is not None
    assert exc.metadata["prompt"] == "Release 1.2"
    assert exc.metadata["questions"][0]["context"] == "Friday deploy"


@pytest.mark.parametrize(
    ("questions", "detail"),
    [
        ([], "questions: 1 to 4 questions, not 0"),
        (
            [question(f"Q{n}?", "H", ["a", "b"]) for n in range(5)],
            "questions: 1 to 4 questions, not 5",
        ),
        (
            [question("Q?", "Much too long", ["a", "b"])],
            "questions[0].header: at most 12 characters",
        ),
        ([question("Q?", "H", ["a"])], "questions[0].options: at least 2 items"),
        ([question("Q?", "H", ["a", "b", "c", "d", "e"])], "questions[0].options: at most 4 items"),
        (
            [question("Q?", "H", ["a", "b"]), question("R?", "H", ["a", "a"])],
            "questions[1].options: duplicate label 'a'",
        ),
    ],
)
def test_ask_refuses_malformed_questions_at_the_call(
    questions: list[dict[str, Any]], detail: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        ask(questions)
    assert caught.value.code == "invalid_question"
    assert caught.value.detail == detail


class Colour(StrEnum):
    red = "red"
    blue = "blue"


class Size(IntEnum):
    small = 1
    large = 2


class Order(BaseModel):
    """What to ship."""

    item: str = Field(description="Catalogue name", max_length=40)
    quantity: int = Field(default=1, ge=1)
    price: float | None = None
    colour: Colour = Colour.red
    size: Size | None = None
    extras: list[Literal["gift wrap", "insurance"]] = []
    colours: list[Colour] = []
    rush: bool = False


def test_schema_for_flattens_enums_and_optionals_to_the_supported_subset() -> None:
    schema = schema_for(Order)
    assert schema["type"] == "object"
    assert schema["title"] == "Order"
    assert schema["description"] == "What to ship."
    assert schema["required"] == ["item"]
    props = schema["properties"]
    assert props["item"] == {
        "type": "string",
        "title": "Item",
        "description": "Catalogue name",
        "maxLength": 40,
    }
    assert props["quantity"] == {"type": "integer", "title": "Quantity", "default": 1, "minimum": 1}
    assert props["price"] == {"type": "number", "title": "Price"}  # Optional: not required
    assert props["colour"] == {
        "type": "string",
        "enum": ["red", "blue"],
        "default": "red",
        "title": "Colour",
    }
    assert props["size"] == {"type": "integer", "enum": [1, 2], "title": "Size"}
    assert props["extras"]["items"] == {"type": "string", "enum": ["gift wrap", "insurance"]}
    assert props["colours"]["items"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["rush"] == {"type": "boolean", "title": "Rush", "default": False}
    assert "$defs" not in schema
    validate({"answer_schema": schema}, "question")


def test_an_answer_round_trips_into_the_model() -> None:
    schema = schema_for(Order)
    answer = validate_answer(
        {"answer_schema": schema}, {"item": "Lamp", "size": 2, "colours": ["blue"], "price": 9.5}
    )
    assert parse_answer(Order, answer) == Order(
        item="Lamp", size=Size.large, colours=[Colour.blue], price=9.5
    )


def test_ask_for_defers_with_the_models_schema() -> None:
    exc = deferred(ask_for, Order, queue="shipping")
    assert exc.kind == "question"
    assert exc.metadata == {
        "answer_schema": schema_for(Order),
        "prompt": "What to ship.",  # the model's docstring
        "queue": "shipping",
    }


class Address(BaseModel):
    city: str


class Nested(BaseModel):
    address: Address


class Mapping_(BaseModel):
    tags: dict[str, str]


class Union_(BaseModel):
    value: int | str


class FreeList(BaseModel):
    names: list[str]


@pytest.mark.parametrize(
    ("model", "detail"),
    [
        (Nested, "Nested.properties.address: unsupported type 'object' (fields can't nest)"),
        (Mapping_, "Mapping_.properties.tags: unsupported type 'object' (fields can't nest)"),
        (Union_, "Union_.properties.value: unsupported 'anyOf'"),
        (
            FreeList,
            "FreeList.properties.names: an array must have 'items' with an 'enum' (a list of "
            "choices)",
        ),
    ],
)
def test_schema_for_refuses_field_types_no_form_can_show(
    model: type[BaseModel], detail: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        schema_for(model)
    assert caught.value.code == "invalid_question"
    assert caught.value.detail.startswith(detail)


def test_parse_answer_says_what_does_not_fit() -> None:
    with pytest.raises(InvalidAnswer) as caught:
        parse_answer(Order, {"quantity": 2})
    assert caught.value.detail == "answer.item: Field required"
