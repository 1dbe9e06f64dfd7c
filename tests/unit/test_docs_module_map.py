"""docs/architecture.md's module map names every module, and no module that is gone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_map():  # tools/ is no package: load the script by path
    spec = importlib.util.spec_from_file_location("module_map", ROOT / "tools" / "module_map.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_has_a_row_and_every_row_a_module() -> None:
    tool = _module_map()
    _, problems = tool.update(tool.PAGE.read_text())
    assert problems == [], "run `uv run python tools/module_map.py` and write the rows it names"


def test_the_check_finds_a_module_without_a_row() -> None:
    tool = _module_map()
    page = tool.PAGE.read_text().replace("| `facade.py` |", "| `facade_gone.py` |")
    _, problems = tool.update(page)
    assert "broker/facade.py: no row in the module map" in problems
    assert "broker/facade_gone.py: row for a file that is gone" in problems
