"""Every `# type: ignore` in the code mypy checks names its error code and says why, on its line.

mypy itself refuses an ignore without a code (`enable_error_code = ["ignore-without-code"]`)
and one that silences nothing (`warn_unused_ignores`); the reason is this test's.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IGNORE = re.compile(r"#\s*type:\s*ignore\b")
EXPLAINED = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(?:,\s*[a-z-]+)*\]  # \S")


def unexplained(line: str) -> bool:
    """Whether `line` holds an ignore without its code and a reason after it."""
    return bool(IGNORE.search(line)) and not EXPLAINED.search(line)


def checked_files() -> list[Path]:
    """The Python files of `[tool.mypy] files` (what `uv run mypy` checks)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    return sorted(p for entry in config["files"] for p in (ROOT / entry).rglob("*.py"))


def test_every_type_ignore_names_its_code_and_a_reason() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in checked_files()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if unexplained(line)
    ]
    assert found == [], "write `# type: ignore[code]  # why` (or fix the type)"


def test_an_ignore_without_a_code_or_a_reason_is_found() -> None:
    assert unexplained("x = f()  # type: ignore")
    assert unexplained("x = f()  # type: ignore[arg-type]")
    assert unexplained("x = f()  # type: ignore  # the library's hint is wrong")
    assert not unexplained("x = f()  # type: ignore[arg-type]  # the library's hint says int")
    assert not unexplained("x = f()  # a comment about types")
