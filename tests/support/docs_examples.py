"""The user docs' text and code blocks, for the tests that run their examples as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def page(name: str) -> str:
    """README.md (`"README.md"`) or a page under docs/ (`"remote-agents.md"`)."""
    path = ROOT / name if name in ("README.md", "CHANGELOG.md") else ROOT / "docs" / name
    return path.read_text()


def every_page() -> str:
    """README.md and every page under docs/, one after another."""
    return "\n".join(
        [page("README.md"), *(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))]
    )


def blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of `language` (the info string as written after the fence)."""
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def home_page(readme: str) -> str:
    """docs/index.md as it must be: README.md with links made relative to docs/ (the site's
    home page), the changelog named rather than linked (it is outside the site)."""
    text = readme.replace("](docs/", "](")
    return text.replace("[CHANGELOG.md](CHANGELOG.md)", "`CHANGELOG.md` (in the repository)")
