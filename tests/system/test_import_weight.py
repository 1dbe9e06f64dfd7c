"""Processes that never run an agent never load pydantic-ai.

The API, the CLI and the roles besides the worker only name agents and enqueue their jobs;
pydantic-ai's imports take about 1.5 s and 20 MB, paid by every `approval-broker` command and
every role process of a fleet (and many times over by the test suite). A fresh interpreter
imports each entry point and reports whether pydantic-ai came with it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

ENTRY_POINTS = [
    "approval_broker.cli",
    "api.app",
    "api.server",
    "notifiers.runner",
    "workers.sweeper",
    "workers.resumer",
    "broker.runs.starting",
    "broker.runs.agents",
]


def loads_pydantic_ai(*modules: str) -> bool:
    """Whether a fresh interpreter that imports `modules` has pydantic-ai loaded."""
    probe = f"import sys, {', '.join(modules)}; print('pydantic_ai' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return loaded.stdout.strip() == "True"


def test_the_entry_points_that_run_no_agent_do_not_import_pydantic_ai() -> None:
    if loads_pydantic_ai(*ENTRY_POINTS):  # one interpreter for all; on failure, name the culprits
        culprits = [m for m in ENTRY_POINTS if loads_pydantic_ai(m)]
        pytest.fail(f"importing {', '.join(culprits)} loads pydantic-ai")


def test_the_worker_does_load_pydantic_ai() -> None:
    """The probe sees pydantic-ai when it is there: the worker runs agents."""
    assert loads_pydantic_ai("workers.worker")
