"""The import paths users write, and RQ keeps in queued jobs, name the modules that hold the code.

The re-exports kept for the unreleased 0.1.0 are gone (CHANGELOG, "Unreleased"): each name is
imported from its own module, and a job is queued under its function's own path.
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
        "broker.facade.Broker",
        "broker.testing.InMemoryBroker",
        "broker.ask.ask",
        "broker.ask.ask_for",
        "approval_broker_client.RemoteBroker",
        "approval_broker_client.BrokerApprovals",
        "broker.audit.append_entry",
        "broker.domain.models.RunStatus",
        "broker.domain.models.Request",
        "broker.runs.agents.register_agent",
        "broker.runs.agents.DepsContext",
        "broker.runs.starting.start_run",
        "broker.runs.starting.wait_run",
        "broker.domain.rules.models.parse_body",
        "broker.facade.RuleExists",
        "broker.facade.sync_at_start",
    ],
)
def test_a_documented_import_path_imports(dotted: str) -> None:
    assert _attribute(dotted) is not None


@pytest.mark.parametrize(
    "gone",
    [
        "broker.agents",
        "broker.client",
        "broker.jobs",
        "broker.models",
        "broker.remote",
        "broker.rules",
        "broker.runs.tool_results",
        "workers.jobs",
    ],
)
def test_the_compatibility_re_exports_are_gone(gone: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(gone)


@pytest.mark.parametrize("name", ["run_agent", "resume_agent"])
def test_a_job_is_queued_under_its_functions_own_module(name: str) -> None:
    from broker.runs import agent_jobs
    from broker.runs.starting import RESUME_JOB, RUN_JOB

    queued = RUN_JOB if name == "run_agent" else RESUME_JOB
    assert queued == f"broker.runs.agent_jobs.{name}"
    assert _attribute(queued) is getattr(agent_jobs, name)
