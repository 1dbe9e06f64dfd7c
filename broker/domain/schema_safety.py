"""JSON Schemas from requesters, checked and applied within bounds of size, depth and time.

A requester sends schemas (`metadata.answer_schema`, `args_schema`) that the broker applies
to answers and `modified` args: on Python's backtracking `re`, `{"pattern": "^(a+)+$"}` and a
string of 30 `a`s and a `!` take seconds (doubling per character), and jsonschema's default
registry fetches a remote `$ref` over the network. So every schema is applied by validators
made with jsonschema's public extension API (`jsonschema.validators.extend`):

- `pattern`, `patternProperties` and `additionalProperties` (which reads the
  `patternProperties` regexes) run on RE2 (`google-re2`), an automaton that cannot backtrack:
  linear in the text. A regex RE2 can't compile (a backreference, a lookaround) is refused
  when the schema is checked, naming the keyword and its path. The meta-schema check runs
  without format checks (its `format: "regex"` one compiles patterns with Python's `re`), and
  values are validated without a format checker: `format` is an annotation only.
- `uniqueItems` hashes the items (jsonschema's fallback compares every pair).
- Only the keywords in `KEYWORDS` are accepted; `$ref` must point inside the schema
  (`#...`) and references resolve in an empty registry, so nothing is ever fetched.
- A schema is at most `MAX_SCHEMA_BYTES` of JSON and `MAX_SCHEMA_DEPTH` deep; the value it is
  applied to at most `MAX_INSTANCE_BYTES` and `MAX_INSTANCE_DEPTH`.
- Every keyword call is charged for the work it may do (its value's and the instance's sizes,
  regexes times keys) against `WORK_BUDGET`, and a deadline (`DEADLINE_S`) is checked with it;
  past either, or at Python's recursion limit (`$ref` loops), the check stops with
  `TooCostly` (HTTP 422), naming which bound it met. With RE2 and the caps no single keyword
  call is slow, so this bounds a validation's time: at most `DEADLINE_S` (0.5 s) of wall time,
  and the budget alone runs out after 0.3-0.4 s of CPU on a loaded 2-core machine (the
  doubling `$ref` schema in tests/integration/test_schema_regex_safety.py, which checks that
  the budget alone stops it, with no deadline), whatever the schema.

Callers (`broker.domain.answer_schema`, `broker.domain.args_schema`) run these off the event loop (the
API's routes call the broker in the thread pool). Nothing here decides or stores anything.
The validators themselves (RE2 keywords, metering) are `broker.domain.safe_validators`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from typing import Any

import re2
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema import FormatChecker, ValidationError
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator

from broker.domain.bounded_json import depth_of
from broker.domain.errors import InvalidInput
from broker.domain.safe_validators import DRAFTS, Exhausted, metered, regex, validator_class

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_INSTANCE_BYTES = 256 * 1024
MAX_INSTANCE_DEPTH = 32
WORK_BUDGET = 50_000
"""Units of work one validation may spend (a unit: a keyword call, an element it walks, a
regex it runs); a legitimate schema and value spend a few hundred."""
DEADLINE_S = 0.5
"""Wall-clock bound of one validation, should the machine be slow."""
MAX_PATTERN = 1000
"""Characters of one regex."""

KEYWORDS = frozenset(
    {
        # identification and structure
        "$schema",
        "$ref",
        "$defs",
        "definitions",
        "$comment",
        # applicators
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "properties",
        "patternProperties",
        "additionalProperties",
        "propertyNames",
        "dependentSchemas",
        "dependencies",
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        # validation
        "type",
        "enum",
        "const",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "maxContains",
        "minContains",
        "maxProperties",
        "minProperties",
        "required",
        "dependentRequired",
        # annotations (never change what is valid)
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "format",
        "contentEncoding",
        "contentMediaType",
        "discriminator",
    }
)
"""The keywords a requester's schema may use: JSON Schema 2020-12's (draft 7's spellings too)
less the ones that name other documents or depend on evaluation order (`$id`, `$anchor`,
`$dynamicRef`, `$dynamicAnchor`, `$vocabulary`, `unevaluatedProperties`, `unevaluatedItems`),
plus pydantic's `discriminator` annotation."""

_ONE: tuple[str, ...] = (
    "not",
    "if",
    "then",
    "else",
    "additionalProperties",
    "propertyNames",
    "contains",
)
_ONE += ("additionalItems",)
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


class TooCostly(InvalidInput):
    """Applying a schema took more than its budget of work or time."""

    code = "schema_too_costly"


def _regex_problem(pattern: Any) -> str | None:
    if not isinstance(pattern, str):
        return None  # the meta-schema check says what is wrong
    if len(pattern) > MAX_PATTERN:
        return f"a regex of at most {MAX_PATTERN} characters, not {len(pattern)}"
    try:
        regex(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        return (
            f"regex {pattern!r} is not supported ({reason}): patterns run on RE2, without"
            " backreferences or lookaround"
        )
    return None


_NOTHING_REMOTE = referencing.Registry()  # no `retrieve`: a `$ref` elsewhere is unresolvable

_NO_FORMATS = FormatChecker(formats=())
"""The meta-schema check without its `format` checks: its `regex` one compiles every pattern
with Python's `re` (the walk compiles them with RE2 instead, and names the path)."""


# --- checking a schema ---


def _walk(
    schema: Any, where: str, fail: Callable[[str, str], InvalidInput]
) -> Iterator[tuple[str, str, Any]]:
    """Every (path, keyword, value) of `schema` and its subschemas; unknown keywords refused."""
    stack: list[tuple[Any, str]] = [(schema, where)]
    while stack:
        node, at = stack.pop()
        if not isinstance(node, dict):
            continue  # true/false, or a mistake the meta-schema check names
        unknown = sorted(set(node) - KEYWORDS)
        if unknown:
            raise fail(at, f"unsupported keyword {unknown[0]!r}")
        for key, value in node.items():
            yield at, key, value
            if key in _ONE or (key == "items" and isinstance(value, dict)):
                stack.append((value, f"{at}.{key}"))
            elif key in _MANY or (key == "items" and isinstance(value, list)):
                if isinstance(value, list):
                    stack.extend((v, f"{at}.{key}[{i}]") for i, v in enumerate(value))
            elif key in _NAMED or key == "dependencies":
                if isinstance(value, dict):
                    stack.extend((v, f"{at}.{key}.{n}") for n, v in value.items())


def _ref_problem(schema: Any, ref: Any) -> str | None:
    if not isinstance(ref, str):
        return None
    if not ref.startswith("#"):
        return f"$ref {ref!r} points outside the schema: only '#...' references are followed"
    resource = referencing.jsonschema.DRAFT202012.create_resource(schema)
    try:
        _NOTHING_REMOTE.with_resource("", resource).resolver().lookup(ref)
    except referencing.exceptions.Unresolvable:
        return f"$ref {ref!r} names nothing in the schema"
    return None


def check_bounds(schema: Any, where: str, code: str) -> None:
    """Refuse (InvalidInput with `code`) a schema that isn't an object, or is over the caps:
    the first check, before anything walks it."""
    if not isinstance(schema, dict):
        raise InvalidInput(f"{where}: must be a JSON Schema object", code=code)
    if depth_of(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise InvalidInput(f"{where}: nested more than {MAX_SCHEMA_DEPTH} deep", code=code)
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        raise InvalidInput(f"{where}: {size} bytes of JSON; at most {MAX_SCHEMA_BYTES}", code=code)


def check_shape(schema: Any, where: str, code: str) -> list[tuple[str, str, Any]]:
    """Refuse (InvalidInput with `code`, naming the path) a schema over the caps, with a
    keyword outside `KEYWORDS`, or one the meta-schema refuses; else its (path, keyword,
    value) triples for `check_references`."""

    def fail(at: str, message: str) -> InvalidInput:
        return InvalidInput(f"{at}: {message}", code=code)

    check_bounds(schema, where, code)
    if schema.get("$schema") not in DRAFTS:
        raise fail(f"{where}.$schema", "only JSON Schema 2020-12 or draft 7")
    found = list(_walk(schema, where, fail))
    try:
        validator_class(schema).check_schema(schema, format_checker=_NO_FORMATS)  # type: ignore[call-arg]  # jsonschema 4 takes it; types-jsonschema's Validator omits it
    except SchemaError as exc:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
        raise fail(f"{where}{path}", f"not a valid JSON Schema: {exc.message}") from None
    return found


def check_references(schema: Any, found: list[tuple[str, str, Any]], code: str) -> None:
    """Refuse (InvalidInput with `code`) a regex RE2 can't run or a `$ref` that leads outside
    the schema, among `found` (from `check_shape`)."""
    for at, key, value in found:
        problem = None
        if key == "pattern":
            problem = _regex_problem(value)
        elif key == "patternProperties" and isinstance(value, dict):
            problem = next(filter(None, map(_regex_problem, value)), None)
        elif key == "$ref":
            problem = _ref_problem(schema, value)
        if problem:
            raise InvalidInput(f"{at}.{key}: {problem}", code=code)


def check_schema(schema: Any, where: str, code: str) -> None:
    """Refuse (InvalidInput with `code`, naming the path) a schema too large, too deep, with a
    keyword outside `KEYWORDS`, a `$ref` leading outside it, a regex RE2 can't run, or one the
    meta-schema refuses."""
    check_references(schema, check_shape(schema, where, code), code)


@lru_cache(maxsize=256)
def compiled(text: str) -> Validator:
    """The validator of one schema (by its compact JSON), made once per distinct schema."""
    schema = json.loads(text)
    return validator_class(schema)(schema, registry=_NOTHING_REMOTE)


def errors(
    schema: Mapping[str, Any],
    instance: Any,
    what: str,
    code: str,
    *,
    deadline_s: float = DEADLINE_S,
) -> list[ValidationError]:
    """The ways `instance` breaks `schema` (checked before with `check_schema`), all found
    within the work budget and `deadline_s`; InvalidInput (`code`) for an instance over its
    caps, TooCostly past either bound."""
    size = len(
        json.dumps(instance, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    )
    if size > MAX_INSTANCE_BYTES:
        raise InvalidInput(f"{what}: {size} bytes of JSON; at most {MAX_INSTANCE_BYTES}", code=code)
    if depth_of(instance, MAX_INSTANCE_DEPTH) > MAX_INSTANCE_DEPTH:
        raise InvalidInput(f"{what}: nested more than {MAX_INSTANCE_DEPTH} deep", code=code)
    validator = compiled(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    try:
        with metered(WORK_BUDGET, deadline_s):
            return list(validator.iter_errors(instance))
    except (Exhausted, RecursionError) as exc:
        bound = str(exc) if isinstance(exc, Exhausted) else "references that loop"
        raise TooCostly(
            f"{what}: checking it against the schema takes more than the broker allows ({bound})"
        ) from None
    except (re2.error, referencing.exceptions.Unresolvable):  # a schema stored before the checks
        raise InvalidInput(
            f"{what}: the schema has a regex RE2 can't run or a reference outside itself",
            code=code,
        ) from None
