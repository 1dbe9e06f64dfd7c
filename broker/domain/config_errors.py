"""A config's mistakes as one readable line: where (`queues.default.channels[1]`), what, and,
for a misspelt name, what was probably meant.

pydantic says "Extra inputs are not permitted" for an unknown key and names neither the key's
table nor the keys it has; here the key's table is found by walking the section's model along
the error's location, so the line can say `unknown key 'chanels' (did you mean 'channels'?)`.
Lists are written as `a, b, c`, never as Python's reprs.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

CLOSE = 0.6
"""How alike a name must be to be suggested (difflib's ratio): `chanels`/`channels` 0.93,
`requestor`/`requester` 0.89; unrelated short names stay below."""


def listed(names: Iterable[str]) -> str:
    """`a, b, c`: names as a person reads them."""
    return ", ".join(names)


def did_you_mean(word: str, options: Iterable[str], cutoff: float = CLOSE) -> str | None:
    """The option `word` most likely misspells, or None."""
    found = difflib.get_close_matches(word, [o for o in options if o != word], n=1, cutoff=cutoff)
    return found[0] if found else None


def unknown_name(what: str, word: str, options: Sequence[str]) -> str:
    """`unknown key 'chanels' (did you mean 'channels'? known: channels, timeout_s, ...)`."""
    return f"unknown {what} {word!r} {hint(word, options)}"


def unknown_key(word: str, options: Sequence[str]) -> str:
    """What follows `queues.default.chanels: `: `unknown key (did you mean 'channels'? ...)`."""
    return f"unknown key {hint(word, options)}"


def hint(word: str, options: Sequence[str]) -> str:
    """`(did you mean 'channels'? known: channels, timeout_s, ...)`, or only the names known."""
    guess = did_you_mean(word, options)
    known = f"known: {listed(options) or 'none'}"
    return f"(did you mean {guess!r}? {known})" if guess is not None else f"({known})"


def not_defined(what: str, name: str, options: Sequence[str]) -> str:
    """`queue 'x' is not defined (did you mean 'y'? known: default, y)`."""
    guess = did_you_mean(name, options)
    hint = f"did you mean {guess!r}? " if guess is not None else ""
    return f"{what} {name!r} is not defined ({hint}known: {listed(options) or 'none'})"


def where(loc: Sequence[int | str], prefix: str = "") -> str:
    """`queues.default.channels[1]` from pydantic's `("queues", "default", "channels", 1)`."""
    text = prefix
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a table of `model` may have, as written in TOML (aliases first)."""
    return [info.alias or name for name, info in model.model_fields.items() if not info.exclude]


def _inner(annotation: Any) -> Any:
    """A union's one model, dict or list member (`X | None` -> X); the annotation otherwise."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        for member in members:
            if _is_model(member) or get_origin(member) in (dict, list):
                return member
        return members[0] if members else annotation
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def table_at(shape: Any, loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model of the table at `loc` in a value of type `shape` (a model, or a dict or list
    of them); None if the path leaves the models (a free-form value such as a rule's `args`)."""
    current: Any = shape
    i = 0
    while i < len(loc):
        current = _inner(current)
        if _is_model(current):
            fields = {info.alias or name: info for name, info in current.model_fields.items()}
            info = fields.get(str(loc[i]))
            if info is None:
                return None
            current = info.annotation
        elif get_origin(current) in (dict, list, Mapping):
            args = get_args(current)
            current = args[-1] if args else Any
        else:
            return None
        i += 1
    current = _inner(current)
    return current if _is_model(current) else None


def first_error(exc: ValidationError) -> ErrorDetails:
    """The error to report: an unknown key first (it often causes the others: a misspelt
    required key is also "missing"), else pydantic's first."""
    errors = exc.errors()
    for error in errors:
        if error["type"] == "extra_forbidden":
            return error
    return errors[0]


def error_line(
    exc: ValidationError,
    shape: Any,
    prefix: str = "",
    top_keys: Sequence[str] | None = None,
) -> str:
    """One line for `exc`, raised validating a value of type `shape` (the table at `prefix`):
    `where: what`. `top_keys`: the keys the top table may have, when that is more than the
    model's fields (the whole config's: its sections and every channel kind's)."""
    error = first_error(exc)
    loc = list(error["loc"])
    msg = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and loc:
        key, table_loc = str(loc[-1]), loc[:-1]
        if not table_loc and top_keys is not None:
            known: Sequence[str] | None = top_keys
        else:
            table = table_at(shape, table_loc)
            known = keys_of(table) if table is not None else None
        msg = unknown_key(key, known) if known is not None else "unknown key"
    at = where(loc, prefix)
    return f"{at}: {msg}" if at else msg
