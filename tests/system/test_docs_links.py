"""Every relative link and #anchor in README.md and docs/*.md leads somewhere, a section named in
quotes ("see "Sealing"") exists, and no table is cut in two by a blank line.

The pages are rendered with Python-Markdown and the extensions mkdocs.yml names, so links are
read as the site reads them (never inside code) and anchors are the ids mkdocs-material gives
headings. `mkdocs build --strict` (tests/system/test_docs_site.py) checks the docs' own links
too; README.md is outside the site, and neither checks a section named only in quotes.
"""

from __future__ import annotations

import functools
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import markdown
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
QUOTED = re.compile(r'\b(?:see|under|in) "([A-Z][^"]+)"')
"""A section named in prose: `see "Sealing"`, `under "Security"`."""


def render(path: Path) -> tuple[str, list[str]]:
    """The page as HTML, and its headings' ids, as mkdocs.yml's extensions make them."""
    names: list[str] = []
    configs: dict[str, Any] = {}
    for entry in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["markdown_extensions"]:
        name, config = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
        names.append(name)
        configs[name] = config or {}
    md = markdown.Markdown(extensions=names, extension_configs=configs)
    html = md.convert(path.read_text())
    return html, list(ids(md.toc_tokens))


def ids(tokens: list[dict[str, Any]]) -> Any:
    for token in tokens:
        yield token["id"]
        yield from ids(token["children"])


class Links(HTMLParser):
    """`href` and `src` of a page's HTML, and the prose of each paragraph (code left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.paragraphs: list[str] = []
        self.in_paragraph = False
        self.in_code = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.targets += [value for name, value in attrs if name in ("href", "src") and value]
        if tag == "p":
            self.in_paragraph = True
            self.paragraphs.append("")
        if tag in ("code", "pre"):
            self.in_code += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self.in_paragraph = False
        if tag in ("code", "pre"):
            self.in_code -= 1

    def handle_data(self, data: str) -> None:
        if self.in_paragraph and not self.in_code:  # what code shows is not prose
            self.paragraphs[-1] += data


@functools.cache
def parsed(path: Path) -> tuple[Links, list[str]]:
    html, anchors = render(path)
    links = Links()
    links.feed(html)
    return links, anchors


HEADINGS = {
    m.group(1).strip().replace("`", "").lower()
    for path in [*PAGES, ROOT / "CHANGELOG.md"]
    for m in re.finditer(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), re.M)
}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    links, anchors = parsed(path)
    broken = []
    for target in links.targets:
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue  # a page elsewhere: not this test's to fetch
        file = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT)}")
        elif parts.fragment and file.suffix == ".md":
            if parts.fragment not in parsed(file)[1]:
                broken.append(f"{target}: no heading with the id {parts.fragment!r}")
    assert broken == []
    assert path == ROOT / "README.md" or not any(t.startswith("docs/") for t in links.targets), (
        "a docs page links as README does"
    )


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_section_named_in_quotes_exists(path: Path) -> None:
    """`see "Sealing"` names a heading (or its start) of some page, or a page's title."""
    links, _ = parsed(path)
    named = [" ".join(m.group(1).split()) for p in links.paragraphs for m in QUOTED.finditer(p)]
    missing = [name for name in named if not any(h.startswith(name.lower()) for h in HEADINGS)]
    assert missing == []


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_table_is_cut_by_a_blank_line(path: Path) -> None:
    """Rows after a blank line are no table: Markdown renders them as a paragraph of pipes."""
    links, _ = parsed(path)
    assert [p for p in links.paragraphs if p.lstrip().startswith("|")] == []
