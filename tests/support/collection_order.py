"""A test module's level, as the ordering hook in tests/conftest.py spreads the run by it.

The levels are folders (tests/system, tests/unit, tests/integration), except for a channel's
tests, which live together in tests/channels/<kind>/ whatever their level: a module there that
starts processes or browsers says so with `pytestmark = pytest.mark.system`, one that needs no
Redis and no server with `pytest.mark.unit`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

LEVELS = ("system", "unit")


class Marked(Protocol):
    def get_closest_marker(self, name: str) -> Any: ...


def level_of(path: Path, items: Iterable[Marked]) -> str:
    """`system` (processes, browsers, clusters), `unit` (no Redis, no server) or
    `integration`: by the module's folder, or by its mark."""
    items = list(items)
    for level in LEVELS:
        if path.parent.name == level or any(i.get_closest_marker(level) for i in items):
            return level
    return "integration"
