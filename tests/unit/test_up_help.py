"""`up --help` says what `up --demo` starts: four runs (tests/system/test_up_demo_lifecycle.py
sees them: three requests waiting and one the demo's rule approved)."""

from __future__ import annotations

from typer.testing import CliRunner

from approval_broker.cli import app


def test_up_help_says_the_demo_starts_four_runs() -> None:
    done = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.replace("│", " ").split())
    assert (
        "start four runs: two refunds and a question that wait in the inbox, and a refund the rule approves"
        in text
    )
    assert "two runs" not in text
