"""The user docs: README stays short, the docs site builds with every link whole, and no page
reads like a diary (an issue number, a time of day)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs_examples import home_page

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
DIARY = re.compile(r"\b[Ii]ssues? \d+\b|\blate night\b|\btonight\b|\bthis (?:morning|evening)\b")


def test_readme_is_at_most_400_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 400


def test_the_docs_home_page_is_the_readme() -> None:
    """docs/index.md says what README.md says (channels, install, quickstart), its links made
    relative to docs/: write it with `home_page` when README changes."""
    assert (ROOT / "docs" / "index.md").read_text() == home_page((ROOT / "README.md").read_text())


def test_no_page_names_an_issue_or_a_time_of_day() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if DIARY.search(line)
    ]
    assert found == []


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`mkdocs build --strict` once for the module: its run and the site it made."""
    site = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return done, site


def test_the_docs_site_builds_strictly(
    built: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """`mkdocs build --strict`: a broken link or anchor, or a page missing from the nav, fails;
    so do table rows the site renders as text."""
    done, site = built
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / "index.html").exists()
    cut = [  # a blank line inside a table: its rows render as a paragraph, which strict allows
        f"{page.relative_to(site.parent)}: {m.group(0)[:80]}"
        for page in site.rglob("index.html")
        for m in re.finditer(r"<p>\s*\|[^<]*", page.read_text())
    ]
    assert cut == [], "table rows the site shows as text"


def test_the_site_shows_the_module_map_made_from_the_code(
    built: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """docs/modules.md holds only a marker; the built page has the map in its place: a table
    per package, a module's row saying what its docstring says (tools/module_map.py)."""
    done, site = built
    assert done.returncode == 0, done.stderr[-3000:]
    page = (site / "modules" / "index.html").read_text()
    assert "module map -->" not in page
    for folder in ("approval_broker/", "channels/slack/", "broker/store/scripts/"):
        assert f"<code>{folder}</code>" in page
    facade = re.search(r"<td><code>facade\.py</code></td>\s*<td>(.*?)</td>", page)
    assert facade is not None and facade.group(1).startswith("The core's face:")
