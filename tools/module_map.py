"""The module map of the docs site, made when the site is built: every package and module of the
code, each with the first sentence of its docstring (a Lua step: of its header comment).

Nobody keeps the map by hand, so it cannot go stale: mkdocs runs this file as a hook
(`hooks:` in mkdocs.yml) and puts the map where a page says `<!-- module map -->`
(docs/modules.md). `uv run python tools/module_map.py` prints it. A module without a docstring
shows as such on the page, and `tests/unit/test_module_map.py` fails on it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- module map -->"
PACKAGES = (
    ("approval_broker", "the command line and `up`"),
    ("api", "the HTTP API role"),
    ("notifiers", "the notifier role"),
    ("workers", "the worker, resumer and sweeper roles"),
    ("mcp_gateway", "the MCP gateway role"),
    ("channels", "the channel plugins and what they share"),
    ("broker", "the core"),
    ("clients/python/src/approval_broker_client", "the client package: wire models and errors"),
    ("examples/refunds_demo", "the demo agent `up --demo` runs"),
)
"""The code's top-level packages, top layer first (as in docs/architecture.md)."""
SOURCES = (".py", ".lua")
MISSING = "**no docstring**"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")


class Module(NamedTuple):
    path: Path  # relative to ROOT
    summary: str  # MISSING when it has none


def first_sentence(text: str) -> str:
    """The first sentence of `text`'s first paragraph, on one line."""
    paragraph = " ".join(text.strip().split("\n\n", 1)[0].split())
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def summary_of(path: Path) -> str:
    """What a module says it is: its docstring's (a Lua file's header comment's) first sentence."""
    text = path.read_text()
    if path.suffix == ".lua":
        header = []
        for line in text.splitlines():
            if not line.startswith("--"):
                break
            header.append(line.removeprefix("--").strip())
        doc = "\n".join(header)
    else:
        doc = ast.get_docstring(ast.parse(text)) or ""
    return first_sentence(doc) if doc.strip() else MISSING


def packages(root: Path = ROOT) -> Iterator[tuple[Path, str, list[Module]]]:
    """Each package (a folder with `__init__.py`, or a top-level one) as (folder, what its
    `__init__` says, its modules), top-level packages in PACKAGES' order, subpackages sorted."""
    for top, _ in PACKAGES:
        folders = [root / top]
        folders += sorted(p.parent for p in (root / top).rglob("*/__init__.py"))
        folders += sorted(  # a folder of Lua steps is no Python package
            {p.parent for p in (root / top).rglob("*.lua")} - set(folders)
        )
        for folder in folders:
            init = folder / "__init__.py"
            about = summary_of(init) if init.exists() else ""
            modules = [
                Module(p.relative_to(root), summary_of(p))
                for p in sorted(folder.iterdir())
                if p.suffix in SOURCES and p.name != "__init__.py"
            ]
            yield folder.relative_to(root), about, modules


def module_map(root: Path = ROOT) -> str:
    """The map as Markdown: a heading per package, a table of its modules."""
    out: list[str] = []
    for folder, about, modules in packages(root):
        out += [f"### `{folder.as_posix()}/`", ""]
        if about:
            out += [about, ""]
        if modules:
            out += ["| module | what it is |", "|---|---|"]
            out += [f"| `{m.path.name}` | {_cell(m.summary)} |" for m in modules]
            out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    """`text` inside a table cell: a pipe would end the cell, except in a code span (where the
    table reader leaves it alone and an escape would show)."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The mkdocs hook: the map in place of the marker (pages without it are left alone)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, module_map())


if __name__ == "__main__":
    print(module_map())
