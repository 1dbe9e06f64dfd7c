"""Checks and parses cached by the JSON text of what they are given.

A bulk create carries the same question list, answer schema or args schema in every request,
and a run's tools send theirs every round: each is checked once per process, not once per
request. The key is the value's compact JSON in its own order (errors name fields in that
order, so two orders are two entries). The cached function gets a fresh copy decoded from that
text and must return something immutable, since every later caller shares it; a value JSON
can't encode is passed through uncached. A raised error is not cached.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from functools import _CacheInfo, lru_cache
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def json_key(value: Any) -> str | None:
    """The cache key of `value`, or None when it isn't JSON."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None


class JsonCached(Generic[T]):
    """`fn(value, *rest)` computed once per distinct (JSON of value, *rest)."""

    def __init__(self, fn: Callable[..., T], maxsize: int) -> None:
        self.fn = fn
        self._by_text = lru_cache(maxsize=maxsize)(self._decoded)

    def _decoded(self, text: str, *rest: Hashable) -> T:
        return self.fn(json.loads(text), *rest)

    def __call__(self, value: Any, *rest: Hashable) -> T:
        key = json_key(value)
        return self.fn(value, *rest) if key is None else self._by_text(key, *rest)

    def cache_info(self) -> _CacheInfo:
        return self._by_text.cache_info()


def cached_by_json(maxsize: int = 256) -> Callable[[Callable[..., T]], JsonCached[T]]:
    """Decorator: cache a function of a JSON value (and hashable extras) by the value's JSON."""

    def wrap(fn: Callable[..., T]) -> JsonCached[T]:
        return JsonCached(fn, maxsize)

    return wrap
