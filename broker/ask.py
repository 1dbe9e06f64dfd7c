"""For tool authors: ask a person structured questions from inside a pydantic-ai tool.

`ask(...)` and `ask_for(Model)` raise `CallDeferred(kind="question")` with well-formed
`metadata.questions` or `metadata.answer_schema`, and refuse malformed ones at the call
(InvalidInput, `invalid_question`), so the run fails there with a message naming the field
instead of making a request no form could show. `schema_for` turns a pydantic model into the
flat `answer_schema` subset; `parse_answer` turns the answer back into that model.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_ai import CallDeferred
from pydantic_ai.messages import ToolReturnPart

from broker.domain import answer_schema
from broker.domain.questions import InvalidAnswer, Option, Question, parse_questions

M = TypeVar("M", bound=BaseModel)


def question(
    text: str,
    header: str,
    options: Sequence[str | Option | Mapping[str, Any]],
    *,
    multi_select: bool = False,
    context: str | None = None,
) -> dict[str, Any]:
    """One question as `ask` takes it; options may be plain labels."""
    q: dict[str, Any] = {
        "question": text,
        "header": header,
        "multi_select": multi_select,
        "options": [
            {"label": o}
            if isinstance(o, str)
            else o.model_dump(exclude_none=True)
            if isinstance(o, Option)
            else dict(o)
            for o in options
        ],
    }
    if context is not None:
        q["context"] = context
    return q


def _routing(
    prompt: str | None,
    queue: str | None,
    timeout_s: float | None,
    allowed_roles: Sequence[str] | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if prompt is not None:
        out["prompt"] = prompt
    if queue is not None:
        out["queue"] = queue
    if timeout_s is not None:
        out["timeout_s"] = timeout_s
    if allowed_roles is not None:
        out["allowed_roles"] = list(allowed_roles)
    return out


def ask(
    questions: Sequence[Question | Mapping[str, Any]],
    *,
    prompt: str | None = None,
    queue: str | None = None,
    timeout_s: float | None = None,
    allowed_roles: Sequence[str] | None = None,
) -> NoReturn:
    """Pause the tool call on 1-4 multiple-choice questions; the model later reads the answer.

    The prompt people read defaults to the questions themselves. Raises InvalidInput naming
    the field (`questions[1].header: at most 12 characters`) before anything is deferred.
    """
    raw = [
        q.model_dump(exclude_none=True) if isinstance(q, Question) else dict(q) for q in questions
    ]
    parsed = parse_questions(raw, where="questions")
    metadata = {
        "questions": [q.model_dump(exclude_none=True) for q in parsed],
        **_routing(
            prompt or "\n".join(q.question for q in parsed), queue, timeout_s, allowed_roles
        ),
    }
    raise CallDeferred(metadata=metadata, kind="question")


def ask_for(
    model: type[BaseModel],
    *,
    prompt: str | None = None,
    queue: str | None = None,
    timeout_s: float | None = None,
    allowed_roles: Sequence[str] | None = None,
) -> NoReturn:
    """Pause the tool call on a form for `model`'s fields (`answer_schema = schema_for(model)`)."""
    schema = schema_for(model)
    metadata = {
        "answer_schema": schema,
        **_routing(
            prompt or schema.get("description") or schema["title"], queue, timeout_s, allowed_roles
        ),
    }
    raise CallDeferred(metadata=metadata, kind="question")


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A property with `$ref`s inlined and `Optional[X]` (anyOf X, null) made plain X."""
    prop = dict(prop)
    ref = prop.pop("$ref", None)
    if ref is None and isinstance(prop.get("allOf"), list) and len(prop["allOf"]) == 1:
        ref = prop.pop("allOf")[0].get("$ref")
    if ref is not None:
        target = copy.deepcopy(defs.get(ref.rsplit("/", 1)[-1], {}))
        target.pop("title", None)
        prop = {**target, **prop}
    options = prop.get("anyOf")
    if isinstance(options, list):
        rest = [o for o in options if o != {"type": "null"}]
        if len(rest) == 1 and len(rest) < len(options):
            prop.pop("anyOf")
            prop = {**_resolve(rest[0], defs), **prop}
            if prop.get("default", 0) is None:
                prop.pop("default")
    if isinstance(prop.get("items"), dict):
        prop["items"] = _resolve(prop["items"], defs)
        prop["items"].pop("title", None)
    return prop


def schema_for(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON Schema, flattened to what every channel's form can show.

    Enums and optional fields are inlined; a field of another type (a nested model, a dict, a
    union) is refused with InvalidInput naming it.
    """
    full = model.model_json_schema()
    defs = full.get("$defs", {})
    schema: dict[str, Any] = {"type": "object", "title": full.get("title", model.__name__)}
    if full.get("description"):
        schema["description"] = full["description"]
    schema["properties"] = {}
    for name, prop in full.get("properties", {}).items():
        resolved = _resolve(prop, defs)
        resolved.setdefault("title", name.replace("_", " ").title())  # as pydantic titles fields
        schema["properties"][name] = resolved
    if full.get("required"):
        schema["required"] = list(full["required"])
    answer_schema.check_schema(schema, where=model.__name__)
    return schema


def parse_answer(model: type[M], answer: Any) -> M:
    """The answer (or a tool-return part carrying it as metadata) as an instance of `model`."""
    if isinstance(answer, ToolReturnPart):
        answer = answer.metadata
    try:
        return model.model_validate(answer)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise InvalidAnswer(f"answer{'.' + where if where else ''}: {error['msg']}") from None
