"""Each guarantee in docs/architecture.md names the tests that prove it: every test file and
every test function it names exists, so a renamed or moved test shows here, not as a stale
proof on the page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


def guarantees(page: str) -> str:
    """The page's "Guarantees" section."""
    start = page.index("\n## Guarantees\n")
    end = page.find("\n## ", start + 1)
    return page[start : end if end != -1 else None]


def named(section: str) -> tuple[set[str], set[str]]:
    """The test files (paths, or bare `test_x.py` names) and test functions a section names."""
    files = set(re.findall(r"`((?:tests/[\w/]+/)?test_\w+\.py)", section))
    functions = set(re.findall(r"\b(test_\w+)\b(?![.*])", section))  # not `test_api*.py`
    return files, functions


def missing(section: str) -> list[str]:
    """What the section names that the test tree does not have."""
    files, functions = named(section)
    tree = list((ROOT / "tests").rglob("test_*.py"))
    defined = {f for path in tree for f in re.findall(r"def (test_\w+)\(", path.read_text())}
    gone = [f for f in files if not (ROOT / f).is_file() and not any(p.name == f for p in tree)]
    gone += [f for f in functions if f not in defined]
    return sorted(gone)


def test_every_test_a_guarantee_names_exists() -> None:
    section = guarantees(PAGE.read_text())
    files, functions = named(section)
    assert len(files) > 50 and len(functions) > 150  # the list is there, and read
    assert missing(section) == [], "tests the guarantees name that the tree no longer has"


def test_a_test_that_is_gone_is_found() -> None:
    section = (
        "- `tests/integration/test_decide.py`: `test_fifty_threads_one_winner`,\n"
        "  `test_no_such_guarantee_test`; `tests/integration/test_gone_module.py`\n"
    )
    assert missing(section) == [
        "test_no_such_guarantee_test",
        "tests/integration/test_gone_module.py",
    ]
