"""Structured questions (contract): what a `question` request may ask, and what fits as an answer.

A request's `metadata` may carry `questions` (1-4 multiple-choice questions) or `answer_schema`
(a flat JSON Schema, see `broker.domain.answer_schema`). Both are checked when the request is made
(`validate_question_metadata`, code `invalid_question`) and every reply is checked before it
counts (`validate_answer`, code `invalid_answer`), on every channel, so a form in Slack, email
or the inbox can never record an answer the agent can't read. `answer_text` is what the model
reads on resume. Nothing here decides, stores or renders for a channel.
"""

from __future__ import annotations

from typing import Annotated, Any

from approval_broker_client.answers import answer_text as answer_text  # re-exported
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from broker.domain import answer_schema
from broker.domain.errors import InvalidInput
from broker.domain.json_keyed import cached_by_json

MAX_QUESTIONS = 4
MAX_HEADER = 12
MAX_OTHER = 2000


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Option(_Strict):
    """One choice: the label is what is selected and what the model reads."""

    label: Annotated[str, Field(min_length=1, max_length=200)]
    description: Annotated[str, Field(max_length=1000)] | None = None
    preview: Annotated[str, Field(max_length=5000)] | None = None


class Question(_Strict):
    """A multiple-choice question; a person may also write an answer of their own ("Other")."""

    question: Annotated[str, Field(min_length=1, max_length=1000)]
    header: Annotated[str, Field(min_length=1, max_length=MAX_HEADER)]
    context: Annotated[str, Field(max_length=5000)] | None = None
    multi_select: bool = False
    options: Annotated[list[Option], Field(min_length=2, max_length=4)]

    @field_validator("options")
    @classmethod
    def _unique_labels(cls, options: list[Option]) -> list[Option]:
        seen: set[str] = set()
        for option in options:
            if option.label in seen:
                raise ValueError(f"duplicate label {option.label!r}")
            seen.add(option.label)
        return options

    def labels(self) -> list[str]:
        return [o.label for o in self.options]


class QuestionAnswer(BaseModel):
    """The answer to one question: labels chosen (in the options' order) and any own text."""

    model_config = ConfigDict(extra="forbid")

    question: str
    selected: list[str] = Field(default_factory=list)
    other: str | None = None


class Answers(BaseModel):
    """The answer to a request's `questions`: one entry per question, in the questions' order."""

    model_config = ConfigDict(extra="forbid")

    answers: list[QuestionAnswer]


class InvalidAnswer(InvalidInput):
    """A reply that doesn't fit the request's questions or schema; it must not count.

    `question` is the index of the question at fault, `field` the (first) schema field at fault
    and `problems` each faulty field's problem (None / empty when the answer as a whole is
    wrong), so a form can show each error beside its input.
    """

    code = "invalid_answer"

    def __init__(
        self,
        detail: str,
        *,
        question: int | None = None,
        field: str | None = None,
        problems: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.question = question
        self.field = field
        self.problems = problems or ({field: detail.partition(": ")[2] or detail} if field else {})


def _loc(loc: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _message(error: Any) -> str:
    """pydantic's error, said briefly: `at most 12 characters`, `2 to 4 items`."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "string_too_long":
        return f"at most {ctx['max_length']} characters"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "too_long":
        return f"at most {ctx['max_length']} items"
    if kind == "too_short":
        return f"at least {ctx['min_length']} items"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind in ("dict_type", "model_type"):
        return "must be an object"
    if kind == "list_type":
        return "must be a list"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return str(error["msg"])


def _questions_error(exc: ValidationError, where: str) -> InvalidInput:
    error = exc.errors()[0]
    return InvalidInput(f"{where}{_loc(error['loc'])}: {_message(error)}", code="invalid_question")


def parse_questions(raw: Any, where: str = "metadata.questions") -> list[Question]:
    """Questions from JSON, or InvalidInput (`invalid_question`) naming the field at fault.

    Parsed once per distinct list (by its JSON) in this process; Questions are frozen."""
    return list(_parsed(raw, where))


@cached_by_json()
def _parsed(raw: Any, where: str) -> tuple[Question, ...]:
    return tuple(_parse_questions(raw, where))


def _parse_questions(raw: Any, where: str) -> list[Question]:
    if not isinstance(raw, list):
        raise InvalidInput(f"{where}: must be a list of questions", code="invalid_question")
    if not raw or len(raw) > MAX_QUESTIONS:
        raise InvalidInput(
            f"{where}: 1 to {MAX_QUESTIONS} questions, not {len(raw)}", code="invalid_question"
        )
    questions = []
    for i, item in enumerate(raw):
        try:
            questions.append(Question.model_validate(item))
        except ValidationError as exc:
            raise _questions_error(exc, f"{where}[{i}]") from None
        earlier = [q.question for q in questions[:i]]
        if questions[i].question in earlier:
            raise InvalidInput(
                f"{where}[{i}].question: the same as question {earlier.index(questions[i].question)}",
                code="invalid_question",
            )
    return questions


def validate_question_metadata(metadata: dict[str, Any], kind: str | None = None) -> None:
    """Refuse (InvalidInput, code `invalid_question`) malformed `questions` or `answer_schema`.

    Metadata without either is fine. With `kind`, only a `question` request may carry them.
    """
    has_questions, has_schema = "questions" in metadata, "answer_schema" in metadata
    if not (has_questions or has_schema):
        return
    if has_questions and has_schema:
        raise InvalidInput(
            "metadata: give either questions or answer_schema, not both", code="invalid_question"
        )
    key = "questions" if has_questions else "answer_schema"
    if kind is not None and kind != "question":
        raise InvalidInput(
            f"metadata.{key}: only a question request may carry {key} (this one is {kind!r})",
            code="invalid_question",
        )
    if has_questions:
        parse_questions(metadata["questions"])
    else:
        answer_schema.check_schema(metadata["answer_schema"])


def is_structured(metadata: dict[str, Any]) -> bool:
    """Whether answers to this request are checked against questions or a schema."""
    return "questions" in metadata or "answer_schema" in metadata


def has_form(metadata: dict[str, Any]) -> bool:
    """Whether a channel can show this request's structured form (well-formed metadata).

    Requests are checked when made; this guards renderers against one stored before that.
    """
    if not is_structured(metadata):
        return False
    try:
        validate_question_metadata(metadata)
    except InvalidInput:
        return False
    return True


def questions_of(metadata: dict[str, Any]) -> list[Question] | None:
    """The request's questions (already checked at creation), or None if it has none."""
    if "questions" not in metadata:
        return None
    return parse_questions(metadata["questions"])


def _answer_one(i: int, q: Question, given: QuestionAnswer, j: int) -> dict[str, Any]:
    """Question `i` answered by `given`, the `j`th entry of the reply's `answers`."""
    where = f"answer.answers[{j}]"
    labels = q.labels()
    for label in given.selected:
        if label not in labels:
            raise InvalidAnswer(
                f"{where}.selected: {label!r} is not an option of {q.question!r} "
                f"(options: {', '.join(labels)})",
                question=i,
            )
    if len(set(given.selected)) != len(given.selected):
        raise InvalidAnswer(f"{where}.selected: an option is chosen twice", question=i)
    other = given.other.strip() if given.other is not None else None
    other = other or None
    if other is not None and len(other) > MAX_OTHER:
        raise InvalidAnswer(f"{where}.other: at most {MAX_OTHER} characters", question=i)
    chosen = len(given.selected) + (other is not None)
    if chosen == 0:
        raise InvalidAnswer(
            f"{where}: {q.question!r} is not answered (choose an option or write 'other')",
            question=i,
        )
    if not q.multi_select and chosen > 1:
        raise InvalidAnswer(
            f"{where}: {q.question!r} takes one choice (an option or 'other'), not {chosen}",
            question=i,
        )
    selected = [label for label in labels if label in given.selected]
    return {"question": q.question, "selected": selected, "other": other}


def _validate_answers(questions: list[Question], answer: Any) -> dict[str, Any]:
    try:
        parsed = Answers.model_validate(answer)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise InvalidAnswer(f"answer{_loc(error['loc'])}: {_message(error)}") from None
    by_text = {q.question: i for i, q in enumerate(questions)}
    given: dict[int, tuple[int, QuestionAnswer]] = {}
    for j, item in enumerate(parsed.answers):
        i = by_text.get(item.question)
        if i is None:
            raise InvalidAnswer(
                f"answer.answers[{j}].question: {item.question!r} is not one of the questions"
            )
        if i in given:
            raise InvalidAnswer(f"answer.answers[{j}]: {item.question!r} is answered twice")
        given[i] = (j, item)
    out = []
    for i, q in enumerate(questions):
        if i not in given:
            raise InvalidAnswer(f"answer.answers: no answer to {q.question!r}", question=i)
        j, item = given[i]
        out.append(_answer_one(i, q, item, j))
    return {"answers": out}


def validate_answer(request_metadata: dict[str, Any], answer: Any) -> Any:
    """The answer, normalised, if it fits the request's questions or schema; else InvalidAnswer.

    Normalised: answers in the questions' order, labels in the options' order, blank `other`
    as null; a schema answer gets the defaults of fields left out. A request with neither
    takes any answer as given.
    """
    questions = questions_of(request_metadata)
    if questions is not None:
        return _validate_answers(questions, answer)
    if "answer_schema" in request_metadata:
        schema = request_metadata["answer_schema"]
        filled, problems, detail = answer_schema.validate(schema, answer)
        if detail:
            fields = {k: v for k, v in problems.items() if k}
            raise InvalidAnswer(detail, field=next(iter(fields), None), problems=fields)
        return filled
    return answer
