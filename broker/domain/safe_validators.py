"""jsonschema validators that can't run away: regexes on RE2, and every keyword call metered.

Made with jsonschema's public extension API (`jsonschema.validators.extend`) for the drafts a
requester may name: `pattern`, `patternProperties` and `additionalProperties` run on RE2 (no
backtracking), `uniqueItems` hashes the items, and every keyword call is charged for the work
it may do against the budget of the validation running in this thread (`metered`), with its
deadline checked at each charge. What a schema may contain, the caps and the error texts are
`broker.domain.schema_safety`'s; this module never refuses a schema itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import re2
from jsonschema import Draft7Validator, Draft202012Validator, ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend

DRAFTS: dict[str | None, type[Validator]] = {
    None: Draft202012Validator,
    "https://json-schema.org/draft/2020-12/schema": Draft202012Validator,
    "https://json-schema.org/draft/2020-12/schema#": Draft202012Validator,
    "http://json-schema.org/draft-07/schema": Draft7Validator,
    "http://json-schema.org/draft-07/schema#": Draft7Validator,
}
"""The drafts a schema may name in `$schema` (none: 2020-12)."""

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@lru_cache(maxsize=1024)
def regex(pattern: str) -> Any:
    """`pattern` compiled by RE2 (cached); `re2.error` when RE2 can't run it."""
    return re2.compile(pattern, _RE2_OPTIONS)


# --- work accounting (per thread: a validation runs in one thread from start to end) ---

_meter = threading.local()


def _spend(units: int) -> None:
    left = getattr(_meter, "left", None)
    if left is None:
        return  # not inside `metered` (the meta-schema check): nothing to bound
    left -= units
    _meter.left = left
    if left < 0:
        raise Exhausted("too much work")
    if time.monotonic() > _meter.deadline:
        raise Exhausted(f"longer than {_meter.deadline_s:g} s")


class Exhausted(Exception):
    """Raised from inside a keyword: not a ValidationError, so `anyOf`/`not` don't swallow it.
    Its text names the bound met."""


def _size(value: Any) -> int:
    return len(value) if isinstance(value, dict | list) else 0


def _metered(fn: Callable[..., Any]) -> Callable[..., Any]:
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _spend(1 + _size(value) + _size(instance))
        return fn(validator, value, instance, schema)

    return keyword


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    _spend(len(patterns) * len(instance))
    for pattern, subschema in patterns.items():
        compiled = regex(pattern)
        for name, value in instance.items():
            if compiled.search(name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = [regex(p) for p in schema.get("patternProperties", {})]
    _spend(len(instance) * (1 + len(patterns)))
    extras = [
        name for name in instance if name not in known and not any(p.search(name) for p in patterns)
    ]
    if validator.is_type(additional, "object"):
        for name in extras:
            yield from validator.descend(instance[name], additional, path=name)
    elif not additional and extras:
        names = ", ".join(repr(n) for n in sorted(extras))
        if "patternProperties" in schema:
            regexes = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{names} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({names} {verb} unexpected)"
            )


def _key(value: Any) -> Any:
    """A hashable stand-in equal for values JSON Schema calls equal (1 == 1.0, True != 1)."""
    if isinstance(value, bool) or value is None:
        return ("c", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, list):
        return ("l", tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("d", frozenset((k, _key(v)) for k, v in value.items()))
    return ("s", value)


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if unique and validator.is_type(instance, "array"):
        _spend(len(instance))
        if len({_key(v) for v in instance}) != len(instance):
            yield ValidationError(f"{instance!r} has non-unique elements")


def _safe(base: type[Validator]) -> type[Validator]:
    keywords = {k: _metered(fn) for k, fn in base.VALIDATORS.items()}
    keywords.update(
        pattern=_metered(_pattern),
        patternProperties=_metered(_pattern_properties),
        additionalProperties=_metered(_additional_properties),
        uniqueItems=_metered(_unique_items),
    )
    safe: type[Validator] = extend(base, validators=keywords)
    return safe


@contextmanager
def metered(budget: int, deadline_s: float) -> Iterator[None]:
    """Charge the keyword calls of this thread's validation against `budget` units and a
    deadline `deadline_s` from now; past either a keyword raises `Exhausted`."""
    _meter.left, _meter.deadline = budget, time.monotonic() + deadline_s
    _meter.deadline_s = deadline_s
    try:
        yield
    finally:
        _meter.left = None


_SAFE: dict[type[Validator], type[Validator]] = {
    base: _safe(base) for base in {Draft202012Validator, Draft7Validator}
}


def validator_class(schema: Mapping[str, Any]) -> type[Validator]:
    return _SAFE[DRAFTS.get(schema.get("$schema"), Draft202012Validator)]
