"""The import paths users write, and RQ keeps in queued jobs, keep working whatever the layout.

This file names the old import paths on purpose: README and docs showed them, user code and
tests import them, and a job queued before an upgrade names its function by one of them.
"""

from __future__ import annotations

import importlib

import pytest


def _attribute(dotted: str) -> object:
    """What an import path such as RQ's `Job.func_name` names: a module's attribute."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    "dotted",
    [
        "broker.client.Broker",
        "broker.testing.InMemoryBroker",
        "broker.ask.ask",
        "broker.ask.ask_for",
        "broker.remote.RemoteBroker",
        "broker.remote.BrokerApprovals",
        "broker.audit.append_entry",
        "broker.models.RunStatus",
        "broker.models.Request",
        "broker.agents.register_agent",
        "broker.agents.DepsContext",
        "broker.runs.start_run",
        "broker.runs.wait_run",
        "broker.rules.parse_body",
        "broker.rules.RuleExists",
        "broker.rules.sync_at_start",
    ],
)
def test_a_documented_import_path_still_imports(dotted: str) -> None:
    assert _attribute(dotted) is not None


@pytest.mark.parametrize("old_name", ["broker.jobs.run_agent", "broker.jobs.resume_agent"])
def test_a_job_queued_under_the_old_function_path_finds_the_same_function(old_name: str) -> None:
    from broker.runs import RESUME_JOB, RUN_JOB

    current = RUN_JOB if old_name.endswith("run_agent") else RESUME_JOB
    assert _attribute(old_name) is _attribute(current)
