"""A tool's argument schema: checked when a request carries one, and met by `modified` args.

A person who modifies a call's args gives the agent's tool what it will run with; without this,
anything would pass and the tool would fail (or worse, run) on args it never accepts. The schema
is the tool's JSON Schema (pydantic-ai's `parameters_json_schema`, or `args_schema` given to
`POST /v1/requests`). This module only judges; it never stores anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from broker.errors import InvalidInput
from broker.json_keyed import cached_by_json
from broker.models import canonical_json

MAX_SCHEMA_BYTES = 64 * 1024
"""A schema is stored with each request: one this large is a mistake, not a tool."""


def check_schema(schema: Mapping[str, Any]) -> None:
    """Refuse a schema that is not a JSON Schema for an object of args (422 `invalid_schema`).

    Checked once per distinct schema in this process (a run's tools send theirs every round)."""
    _checked(schema)


@cached_by_json()
def _checked(schema: Any) -> None:
    size = len(canonical_json(schema).encode())
    if size > MAX_SCHEMA_BYTES:
        raise InvalidInput(
            f"args_schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are kept",
            code="invalid_schema",
        )
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise InvalidInput(
            f"args_schema is not a JSON Schema (at {where}): {exc.message}",
            code="invalid_schema",
        ) from None
    kind = schema.get("type")
    if kind is not None and kind != "object":
        raise InvalidInput(
            f"args_schema must describe an object of named args, not type {kind!r}",
            code="invalid_schema",
        )


@cached_by_json()
def _validator(schema: Any) -> Draft202012Validator:
    """One compiled validator per distinct schema."""
    return Draft202012Validator(schema)


def check_args(schema: Mapping[str, Any] | None, args: Mapping[str, Any]) -> None:
    """Refuse `args` that don't meet `schema` (422 `invalid_args`, naming the field); no
    schema: anything goes, as before schemas were stored."""
    if schema is None:
        return
    error = best_match(_validator(schema).iter_errors(dict(args)))
    if error is None:
        return
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [n for n in error.validator_value if n not in error.instance]
        path += missing[:1]
    elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(error.schema.get("properties") or {})
        extra = sorted(n for n in error.instance if n not in known)
        path += extra[:1]
    field = ".".join(["args", *path])
    raise InvalidInput(
        f"modified args don't meet the tool's schema: {field}: {error.message}",
        code="invalid_args",
    )
