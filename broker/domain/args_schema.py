"""A tool's argument schema: checked when a request carries one, and met by `modified` args.

A person who modifies a call's args gives the agent's tool what it will run with; without this,
anything would pass and the tool would fail (or worse, run) on args it never accepts. The schema
is the tool's JSON Schema (pydantic-ai's `parameters_json_schema`, or `args_schema` given to
`POST /v1/requests`). The schema is checked, and args are validated, by
`broker.domain.schema_safety` (the keywords it lists, regexes on RE2, size and depth caps and a work
budget), so neither can hold a thread for long. This module only judges; it never stores
anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema.exceptions import best_match

from broker.domain import schema_safety
from broker.domain.errors import InvalidInput
from broker.domain.json_keyed import cached_by_json

MAX_SCHEMA_BYTES = schema_safety.MAX_SCHEMA_BYTES
"""A schema is stored with each request: one this large is a mistake, not a tool."""


def check_schema(schema: Mapping[str, Any]) -> None:
    """Refuse a schema that is not a JSON Schema for an object of args (422 `invalid_schema`).

    Checked once per distinct schema in this process (a run's tools send theirs every round)."""
    _checked(schema)


@cached_by_json()
def _checked(schema: Any) -> None:
    schema_safety.check_schema(schema, "args_schema", "invalid_schema")
    kind = schema.get("type")
    if kind is not None and kind != "object":
        raise InvalidInput(
            f"args_schema must describe an object of named args, not type {kind!r}",
            code="invalid_schema",
        )


def check_args(schema: Mapping[str, Any] | None, args: Mapping[str, Any]) -> None:
    """Refuse `args` that don't meet `schema` (422 `invalid_args`, naming the field); no
    schema: anything goes, as before schemas were stored."""
    if schema is None:
        return
    found = schema_safety.errors(schema, dict(args), "modified args", "invalid_args")
    error = best_match(found)
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
