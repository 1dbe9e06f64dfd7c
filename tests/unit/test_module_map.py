"""The module map the docs site shows (tools/module_map.py, run by mkdocs as a hook) names every
module of the code with what its docstring says it is: none is left out, none lacks one."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:  # tools/ is no package: load the script by path
    spec = importlib.util.spec_from_file_location("module_map", ROOT / "tools" / "module_map.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(page: str) -> dict[str, str]:
    """`folder/module` -> its summary, read back from the map's headings and table rows."""
    rows: dict[str, str] = {}
    folder = ""
    for line in page.splitlines():
        if heading := re.fullmatch(r"### `(.+)/`", line):
            folder = heading.group(1)
        elif row := re.fullmatch(r"\| `([^`]+)` \| (.*) \|", line):
            rows[f"{folder}/{row.group(1)}"] = row.group(2)
    return rows


def test_every_module_of_the_code_is_on_the_map_with_its_docstring() -> None:
    tool = _tool()
    rows = _rows(tool.module_map())
    code = {
        path.relative_to(ROOT).as_posix()
        for top, _ in tool.PACKAGES
        for path in (ROOT / top).rglob("*")
        if path.suffix in tool.SOURCES and path.name != "__init__.py"
    }
    assert sorted(code - set(rows)) == [], "modules the map leaves out"
    assert sorted(set(rows) - code) == [], "rows for files that are not there"
    assert sorted(m for m, summary in rows.items() if summary == tool.MISSING) == [], (
        "modules without a docstring: its first sentence says what the module is"
    )
    assert rows["broker/facade.py"].startswith("The core's face:")
    assert (
        rows["broker/store/scripts/decide.lua"]
        == "Decide a pending request: the first decision wins."
    )


def test_a_module_without_a_docstring_shows_as_such(tmp_path: Path) -> None:
    tool = _tool()
    (tmp_path / "bare.py").write_text("x = 1\n")
    (tmp_path / "step.lua").write_text("local x = 1\n")
    (tmp_path / "told.py").write_text('"""Told.\n\nMore."""\n')
    assert tool.summary_of(tmp_path / "bare.py") == tool.MISSING
    assert tool.summary_of(tmp_path / "step.lua") == tool.MISSING
    assert tool.summary_of(tmp_path / "told.py") == "Told."


def test_the_first_sentence_is_joined_and_a_pipe_stays_in_its_cell() -> None:
    tool = _tool()
    text = "Reading rules: by id, the listing,\nand per version. Then more.\n\nDetails."
    assert tool.first_sentence(text) == "Reading rules: by id, the listing, and per version."
    assert tool.first_sentence("Signs, e.g. links. Rest.") == "Signs, e.g. links."
    assert tool._cell("`rules list|add` or a|b") == "`rules list|add` or a\\|b"


def test_the_hook_puts_the_map_where_a_page_asks_for_it() -> None:
    tool = _tool()
    page = tool.on_page_markdown(f"# Map\n\n{tool.MARKER}\n", None, None, None)
    assert "### `broker/store/`" in page and tool.MARKER not in page
    assert tool.on_page_markdown("# Other\n", None, None, None) == "# Other\n"
