"""What a server-rendered page needs to show a structured question's form (the email page).

Turns a request's `questions` or `answer_schema` into plain dicts a Jinja template loops over:
input names and option values as `channels.answer_forms` reads them back (`q{i}`, `q{i}_other`,
`field:NAME`; values are indices), what was submitted (so a refused form comes back as the
person filled it in) and each error beside its input. It renders nothing and decides nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.domain.answer_schema import FormField, check_schema
from broker.domain.questions import Question, has_form, questions_of
from channels.answer_forms import field_input, other_input, question_input

Submitted = Mapping[str, list[str]]


def _question(
    i: int, q: Question, submitted: Submitted | None, errors: dict[str, str]
) -> dict[str, Any]:
    name, other = question_input(i), other_input(i)
    picked = set(submitted.get(name, [])) if submitted is not None else set()
    return {
        "name": name,
        "other_name": other,
        "header": q.header,
        "question": q.question,
        "context": q.context,
        "multi_select": q.multi_select,
        "options": [
            {
                "value": str(n),
                "label": o.label,
                "description": o.description,
                "preview": o.preview,
                "checked": str(n) in picked,
            }
            for n, o in enumerate(q.options)
        ],
        "other_value": next(iter((submitted or {}).get(other, [])), ""),
        "error": errors.get(name),
        "other_error": errors.get(other),
    }


def _text(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return ""
    return str(value)


def _field(
    field: FormField, prop: dict[str, Any], submitted: Submitted | None, errors: dict[str, str]
) -> dict[str, Any]:
    name = field_input(field.name)
    if submitted is not None:
        given = [v for v in submitted.get(name, []) if v != ""]
    elif field.kind in ("enum", "multi_enum"):
        wanted = field.default if isinstance(field.default, list) else [field.default]
        given = [str(n) for n, c in enumerate(field.choices) if field.has_default and c in wanted]
    elif field.kind == "boolean":
        given = [str(field.default).lower()] if isinstance(field.default, bool) else []
    else:
        given = [_text(field.default)] if field.has_default else []
    max_length = prop.get("maxLength")
    return {
        "name": name,
        "id": f"in-{name.replace(':', '-')}",
        "kind": field.kind,
        "label": field.label,
        "description": field.description,
        "required": field.required,
        "choices": [
            {"value": str(n), "text": _text(c), "checked": str(n) in given}
            for n, c in enumerate(field.choices)
        ],
        "value": given[0] if given and field.kind not in ("multi_enum",) else "",
        "step": "1" if field.kind == "integer" else "any",
        "minimum": _text(prop.get("minimum")),
        "maximum": _text(prop.get("maximum")),
        "max_length": max_length if isinstance(max_length, int) else None,
        "multiline": not isinstance(max_length, int) or max_length > 150,
        "error": errors.get(name),
    }


def answer_form(
    metadata: dict[str, Any],
    submitted: Submitted | None = None,
    errors: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """The form of a structured question (None for a request without one): questions or fields.

    `submitted` is a refused post's values ({input name: values}); `errors` is
    `answer_forms.error_inputs` of the refusal.
    """
    if not has_form(metadata):
        return None
    errors = errors or {}
    questions = questions_of(metadata)
    if questions is not None:
        shown = [_question(i, q, submitted, errors) for i, q in enumerate(questions)]
        return {"questions": shown, "fields": [], "description": None}
    schema = metadata["answer_schema"]
    props = schema["properties"]
    fields = [_field(f, props[f.name], submitted, errors) for f in check_schema(schema)]
    description = schema.get("description") if isinstance(schema.get("description"), str) else None
    return {"questions": [], "fields": fields, "description": description}
