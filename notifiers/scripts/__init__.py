"""Lua used by the notifiers alone, loaded from the `.lua` files beside this module."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def source(name: str) -> str:
    return (files(__package__) / f"{name}.lua").read_text()
