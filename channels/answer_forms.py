"""Reading a structured answer back from a submitted form, and placing errors beside inputs.

Every channel's form (the Slack modal, the email confirmation page, the inbox) names its inputs
the same way, so one reader serves them all:

* question `i`: its choices `q{i}` (values: option indices `"0"`, `"1"`, ...), its own words
  `q{i}_other`;
* schema field `name`: `field:{name}`; an enum's values are choice indices, a boolean's
  `"true"` / `"false"`, numbers and text as typed.

Values are indices, never labels: a label can be longer than a form value may be, and an index
can't be confused with another label. A channel hands `read_answer` a function giving the
strings submitted under a name, or None when the form sent nothing under it (an HTML form that
wants "all boxes unchecked" to count sends an empty hidden value under the checkboxes' name).
Nothing here renders or decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.domain.answer_schema import FormField, check_schema
from broker.domain.questions import InvalidAnswer, Question, questions_of

Values = Callable[[str], list[str] | None]


def question_input(i: int) -> str:
    return f"q{i}"


def other_input(i: int) -> str:
    return f"q{i}_other"


def field_input(name: str) -> str:
    return f"field:{name}"


def _by_index(values: list[str], choices: Sequence[Any], error: InvalidAnswer) -> list[Any]:
    out = []
    for value in values:
        if not (value.isascii() and value.isdigit()) or int(value) >= len(choices):
            raise error
        out.append(choices[int(value)])
    return out


def _questions_answer(questions: list[Question], get: Values) -> dict[str, Any]:
    answers = []
    for i, q in enumerate(questions):
        picked = [v for v in get(question_input(i)) or [] if v != ""]
        bad = InvalidAnswer(f"answer.answers[{i}].selected: not an option", question=i)
        other = next(iter(get(other_input(i)) or []), None)
        answers.append(
            {
                "question": q.question,
                "selected": _by_index(picked, q.labels(), bad),
                "other": other if isinstance(other, str) and other.strip() else None,
            }
        )
    return {"answers": answers}


def _number(field: FormField, text: str) -> int | float:
    bad = InvalidAnswer(f"answer.{field.name}: {text!r} is not a number", field=field.name)
    try:
        number = float(text)
    except ValueError:
        raise bad from None
    if not math.isfinite(number):
        raise bad
    if field.kind == "integer":
        if not number.is_integer():
            raise InvalidAnswer(f"answer.{field.name}: must be a whole number", field=field.name)
        return int(number)
    return int(number) if number.is_integer() and "." not in text else number


def _field_value(field: FormField, raw: list[str] | None) -> tuple[bool, Any]:
    """(given?, value) of one schema input; an input left empty is not given."""
    bad = InvalidAnswer(f"answer.{field.name}: not one of the choices", field=field.name)
    values = [v for v in raw or [] if v != ""]
    if field.kind == "multi_enum":  # a form that sent the name at all means "these, maybe none"
        return raw is not None, _by_index(values, field.choices, bad)
    if len(values) > 1:
        raise InvalidAnswer(f"answer.{field.name}: one value only", field=field.name)
    if not values:
        return False, None
    value = values[0]
    if field.kind == "enum":
        return True, _by_index([value], field.choices, bad)[0]
    if field.kind == "boolean":
        if value not in ("true", "false"):
            raise bad
        return True, value == "true"
    if not value.strip():
        return False, None
    if field.kind in ("number", "integer"):
        return True, _number(field, value.strip())
    return True, value


def read_answer(metadata: dict[str, Any], get: Values) -> Any:
    """The answer a submitted form holds, in the contract's shape (check it with validate_answer).

    Raises InvalidAnswer for values no form of ours could send (an option index out of range,
    a number that isn't one); whether the answer fits is left to `validate_answer`.
    """
    questions = questions_of(metadata)
    if questions is not None:
        return _questions_answer(questions, get)
    answer: dict[str, Any] = {}
    for field in check_schema(metadata["answer_schema"]):
        given, value = _field_value(field, get(field_input(field.name)))
        if given:
            answer[field.name] = value
    return answer


def answer_from_form(metadata: dict[str, Any], form: Mapping[str, Any]) -> Any:
    """`read_answer` for an HTML form post: `form` maps a name to a string or a list of them."""

    def get(name: str) -> list[str] | None:
        if name not in form:
            return None
        value = form[name]
        if isinstance(value, str):
            return [value]
        return [v for v in value if isinstance(v, str)] if isinstance(value, list | tuple) else []

    getlist = getattr(form, "getlist", None)  # starlette's FormData, werkzeug's MultiDict
    if callable(getlist):
        return read_answer(metadata, lambda n: list(getlist(n)) if n in form else None)
    return read_answer(metadata, get)


def error_inputs(exc: InvalidAnswer, metadata: dict[str, Any]) -> dict[str, str]:
    """Which input each problem belongs to: {input name: message}, for showing beside it.

    A problem with the answer as a whole goes to the first input.
    """
    path, _, message = exc.detail.partition(": ")
    if exc.question is not None:
        at = other_input(exc.question) if path.endswith(".other") else question_input(exc.question)
        return {at: message or exc.detail}
    if exc.problems:
        return {field_input(name): problem for name, problem in exc.problems.items()}
    if "answer_schema" in metadata:
        return {field_input(check_schema(metadata["answer_schema"])[0].name): exc.detail}
    return {question_input(0): exc.detail}
