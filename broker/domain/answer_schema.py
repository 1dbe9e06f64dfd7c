"""`metadata.answer_schema`: the flat JSON Schema a question's answer must fit, and its fields.

A form in any channel (inbox, Slack modal, email page) has to render the schema as inputs, so
only a subset is accepted: an object whose properties are strings, numbers, integers, booleans,
an enum, or an array of an enum, with `required`, `default`, `title` and `description` (and
the field keywords in `_FIELD_KEYS`). The schema is checked, and answers are validated, by
`broker.domain.schema_safety`: `jsonschema` with `pattern` on RE2, size and depth caps and a work
budget, so no schema or answer can hold a thread for long. Nothing here decides a request or
knows a channel.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator

from broker.domain import schema_safety
from broker.domain.errors import InvalidInput
from broker.domain.json_keyed import cached_by_json

MAX_PROPERTIES = 50
MAX_ENUM = 100
MAX_NAME = 100  # a field's name goes into form input ids (Slack block_id: 255 at most)
SCALARS = ("string", "number", "integer", "boolean")
# Keywords a form can honour (or safely ignore) beside the ones that give a field its shape.
_ROOT_KEYS = {
    "$schema",
    "type",
    "properties",
    "required",
    "title",
    "description",
    "additionalProperties",
}
_FIELD_KEYS = {
    "type",
    "title",
    "description",
    "default",
    "enum",
    "items",
    "examples",
    "format",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "uniqueItems",
}
_ITEM_KEYS = {"type", "enum", "title", "description"}

FieldKind = Literal["string", "number", "integer", "boolean", "enum", "multi_enum"]


@dataclass(frozen=True)
class FormField:
    """One input of a schema form: what to render and how to read it back."""

    name: str
    kind: FieldKind
    label: str
    description: str | None
    required: bool
    default: Any
    has_default: bool
    choices: tuple[Any, ...] = ()


def _fail(where: str, message: str) -> InvalidInput:
    return InvalidInput(f"{where}: {message}", code="invalid_question")


def _field_kind(where: str, prop: Any) -> FieldKind:
    if not isinstance(prop, dict):
        raise _fail(where, "must be an object (a property schema)")
    union = next((k for k in ("anyOf", "oneOf", "allOf", "$ref") if k in prop), None)
    if union:
        raise _fail(where, f"unsupported {union!r}: give one type (or an enum)")
    if prop.get("type") == "object" or "properties" in prop:
        raise _fail(where, "unsupported type 'object' (fields can't nest)")
    unknown = sorted(set(prop) - _FIELD_KEYS)
    if unknown:
        raise _fail(where, f"unsupported keyword {unknown[0]!r}")
    kind = prop.get("type")
    if "enum" in prop:
        _check_enum(where, prop["enum"], kind)
        return "enum"
    if kind == "array":
        items = prop.get("items")
        if not isinstance(items, dict) or "enum" not in items:
            raise _fail(where, "an array must have 'items' with an 'enum' (a list of choices)")
        unknown = sorted(set(items) - _ITEM_KEYS)
        if unknown:
            raise _fail(f"{where}.items", f"unsupported keyword {unknown[0]!r}")
        _check_enum(f"{where}.items", items["enum"], items.get("type"))
        return "multi_enum"
    if kind in SCALARS:
        return kind
    if kind is None:
        raise _fail(where, "needs a 'type' (string, number, integer, boolean, array) or 'enum'")
    raise _fail(where, f"unsupported type {kind!r} (supported: {', '.join(SCALARS)}, enum, array)")


def _check_enum(where: str, values: Any, kind: Any) -> None:
    if kind is not None and kind not in ("string", "number", "integer"):
        raise _fail(where, f"unsupported enum type {kind!r}")
    if not isinstance(values, list) or not values:
        raise _fail(f"{where}.enum", "must be a non-empty list")
    if len(values) > MAX_ENUM:
        raise _fail(f"{where}.enum", f"at most {MAX_ENUM} choices")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _fail(f"{where}.enum", f"choices must be strings or numbers, not {value!r}")
    if len({json.dumps(v) for v in values}) != len(values):
        raise _fail(f"{where}.enum", "choices must be unique")
    if kind is not None:
        for value in values:
            if not Draft202012Validator({"type": kind}).is_valid(value):
                raise _fail(f"{where}.enum", f"{value!r} is not of type {kind!r}")


def _path(error_path: Any) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error_path)


def check_schema(schema: Any, where: str = "metadata.answer_schema") -> list[FormField]:
    """The form fields of a valid, supported schema; InvalidInput naming the field otherwise.

    Checked once per distinct schema (by its JSON, in order) in this process: a bulk of
    questions with one schema, or a form rendered again, does not check it again."""
    if not isinstance(schema, dict):
        return _check_schema(schema, where)
    return list(_checked(schema, where))


@cached_by_json()
def _checked(schema: Any, where: str) -> tuple[FormField, ...]:
    return tuple(_check_schema(schema, where))


def _check_schema(schema: Any, where: str) -> list[FormField]:
    schema_safety.check_bounds(schema, where, "invalid_question")
    unknown = sorted(set(schema) - _ROOT_KEYS)
    if unknown:
        raise _fail(where, f"unsupported keyword {unknown[0]!r}")
    found = schema_safety.check_shape(schema, where, "invalid_question")
    if not isinstance(schema.get("additionalProperties", False), bool):
        raise _fail(f"{where}.additionalProperties", "must be true or false (fields can't nest)")
    if schema.get("type") != "object":
        raise _fail(f"{where}.type", "must be 'object' (an answer is an object of fields)")
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        raise _fail(f"{where}.properties", "must name at least one field")
    if len(props) > MAX_PROPERTIES:
        raise _fail(f"{where}.properties", f"at most {MAX_PROPERTIES} fields")
    required = schema.get("required", [])
    for name in required:
        if name not in props:
            raise _fail(f"{where}.required", f"{name!r} is not one of the properties")
    fields = []
    for name, prop in props.items():
        at = f"{where}.properties.{name}"
        if not name or len(name) > MAX_NAME:
            raise _fail(at, f"a field name must have 1 to {MAX_NAME} characters")
        kind = _field_kind(at, prop)
        enum = prop.get("enum") or (prop.get("items") or {}).get("enum") or ()
        fields.append(
            FormField(
                name=name,
                kind=kind,
                label=str(prop.get("title") or name),
                description=prop.get("description"),
                required=name in required,
                default=prop.get("default"),
                has_default="default" in prop,
                choices=tuple(enum),
            )
        )
    # the shape is a form's: now its regexes (on RE2) and defaults
    schema_safety.check_references(schema, found, "invalid_question")
    for field in fields:
        if field.has_default:
            at = f"{where}.properties.{field.name}.default"
            prop = props[field.name]
            errors = schema_safety.errors(prop, field.default, at, "invalid_question")
            if errors:
                raise _fail(at, errors[0].message)
    return fields


def validate(schema: dict[str, Any], answer: Any) -> tuple[dict[str, Any], dict[str, str], str]:
    """(answer with defaults filled in, {}, ""), or ({}, {field: problem}, detail) if it doesn't fit.

    Defaults of fields left out are filled in before validating, so an answer means the same
    whichever channel it came from. `field` is "" for a problem with the answer as a whole.
    """
    if not isinstance(answer, dict):
        problem = f"must be an object of fields, not {type(answer).__name__}"
        return {}, {"": problem}, f"answer: {problem}"
    filled = dict(answer)
    for name, prop in schema.get("properties", {}).items():
        if name not in filled and isinstance(prop, dict) and "default" in prop:
            filled[name] = copy.deepcopy(prop["default"])
    try:
        found = schema_safety.errors(schema, filled, "answer", "invalid_answer")
    except InvalidInput as exc:  # over the caps, or too costly: it doesn't count either
        return {}, {"": exc.detail}, exc.detail
    errors = sorted(found, key=lambda e: list(map(str, e.path)))
    if not errors:
        return filled, {}, ""
    problems: dict[str, str] = {}
    lines = []
    for error in errors:
        names = [str(error.path[0])] if error.path else [""]
        required = error.validator_value  # the keyword's value: `required`'s is a list of names
        if error.validator == "required" and not error.path and isinstance(required, Iterable):
            names = [str(r) for r in required if r not in filled] or [""]
        for name in names:
            problems.setdefault(
                name, "required" if error.validator == "required" else error.message
            )
        lines.append(f"answer{_path(error.path)}: {error.message}")
    return {}, problems, "; ".join(lines[:3])
