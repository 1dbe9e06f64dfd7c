"""The run's order knows each module's level (tests/conftest.py spreads the system modules and
runs the unit ones last): by its folder, or, for a channel's tests kept in
tests/channels/<kind>/, by its mark; and every module there that starts processes or browsers
carries the mark."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from tests.support.collection_order import level_of
from tests.support.docs_examples import ROOT

BROWSER_OR_PROCESS_FIXTURES = {"chromium", "demo"}
PROCESS_STARTERS = {"start_up", "start_api", "Popen"}


class Item:
    def __init__(self, *marks: str) -> None:
        self.marks = marks

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.marks else None


def test_a_modules_level_is_its_folder_or_its_mark() -> None:
    assert level_of(Path("tests/system/test_up.py"), [Item()]) == "system"
    assert level_of(Path("tests/unit/test_config.py"), [Item()]) == "unit"
    assert level_of(Path("tests/integration/test_decide.py"), [Item()]) == "integration"
    assert (
        level_of(Path("tests/channels/inbox/test_inbox_browser.py"), [Item("system")]) == "system"
    )
    assert level_of(Path("tests/channels/slack/test_slack_urls.py"), [Item("unit")]) == "unit"
    assert level_of(Path("tests/channels/slack/test_api_slack.py"), [Item()]) == "integration"


def marked(tree: ast.Module, level: str) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return level in ast.unparse(node.value)
    return False


def starts_processes_or_browsers(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            if {a.arg for a in node.args.args} & BROWSER_OR_PROCESS_FIXTURES:
                return True
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else None
            name = node.func.id if isinstance(node.func, ast.Name) else name
            if name in PROCESS_STARTERS:
                return True
    return False


def test_every_channel_module_that_starts_processes_or_browsers_is_marked_system() -> None:
    modules = sorted((ROOT / "tests" / "channels").rglob("test_*.py"))
    assert len(modules) > 40
    unmarked = [
        str(path.relative_to(ROOT))
        for path in modules
        if starts_processes_or_browsers(tree := ast.parse(path.read_text()))
        and not marked(tree, "system")
    ]
    assert unmarked == []
    assert sum(marked(ast.parse(p.read_text()), "system") for p in modules) >= 9
