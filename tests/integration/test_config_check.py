"""`config check` catches what would break later, one line each, naming the file: unknown keys
with "did you mean", role typos, agents that don't import (with the import's error), a missing
environment variable, unknown names listed with the known ones, locations as `channels[1]`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.domain.errors import NotFound
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import start_run

runner = CliRunner()

SECRET = "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1vcHMtd2ViaG9vayE="
QUEUE_KEYS = "channels, timeout_s, escalate_to, roles, quorum, ack_timeout_s"

CASES = {
    "unknown key in a queue": (
        '[queues.default]\nchanels = ["inbox"]\n',
        f"queues.default.chanels: unknown key (did you mean 'channels'? known: {QUEUE_KEYS})",
    ),
    "unknown key before the key it misspells is missing": (
        '[slack]\nbot_tokn = "x"\nsigning_secret = "y"\n',
        "slack.bot_tokn: unknown key (did you mean 'bot_token'? known: bot_token,"
        " signing_secret, api_base_url, channels)",
    ),
    "unknown table": (
        "[slak]\nbot_token = 1\n",
        "slak: unknown key (did you mean 'slack'? known: broker, workers, receipts, audit,"
        " queues, approvers, agents, mcp_gateways, rules, discord, email, slack, teams,"
        " telegram, webhooks)",
    ),
    "unknown key in a webhook endpoint": (
        f'[webhooks.ops]\nurl = "http://127.0.0.1:9/"\nsecret = "{SECRET}"\nevnts = []\n',
        "webhooks.ops.evnts: unknown key (did you mean 'events'?",
    ),
    "unknown key in a channel": (
        '[slack]\nbot_token = "x"\nsigning_secret = "y"\n[slack.channels.a]\nchanel = "C1"\n',
        "slack.channels.a.chanel: unknown key (did you mean 'channel'? known: channel)",
    ),
    "unknown key in a rule": (
        '[[rules]]\nid = "r"\neffect = "allow"\ntool = "t"\nagnt = "x"\n',
        "rules[0].agnt: unknown key (did you mean 'agent'?",
    ),
    "unknown approver key": (
        '[approvers.alice]\nslack_id = "U1"\n',
        "approvers.alice: unknown key 'slack_id' (did you mean 'slack_user_id'?",
    ),
    "role typo of a built-in role": (
        '[approvers.bot]\nroles = ["requestor"]\n',
        "approvers.bot.roles[0]: role 'requestor' is used by no queue, rule or channel"
        " (did you mean 'requester'?)",
    ),
    "role typo of a queue's role": (
        '[approvers.alice]\nroles = ["finanse"]\n[queues.default]\nroles = ["finance"]\n'
        '[approvers.bob]\nroles = ["finance"]\n',
        "approvers.alice.roles[0]: role 'finanse' is used by no queue, rule or channel"
        " (did you mean 'finance'?)",
    ),
    "queue role nobody holds": (
        '[approvers.alice]\nroles = ["finance"]\n[queues.default]\nroles = ["finanse"]\n',
        "queues.default.roles[0]: role 'finanse' is held by no approver or webhook endpoint"
        " (did you mean 'finance'?)",
    ),
    "agent that doesn't import": (
        '[agents.refunds]\npath = "no_such_package.agents:agent"\n',
        "agents.refunds.path: cannot import no_such_package.agents"
        " (ModuleNotFoundError: No module named 'no_such_package')",
    ),
    "agent module that fails while importing": (
        '[agents.refunds]\npath = "broken_agent:agent"\n',
        "agents.refunds.path: cannot import broken_agent (RuntimeError: no API key here)",
    ),
    "agent attribute missing": (
        '[agents.refunds]\npath = "refunds_demo:no_such_agent"\n',
        "agents.refunds.path: refunds_demo has no no_such_agent",
    ),
    "agent path that is no Agent": (
        '[agents.refunds]\npath = "refunds_demo:make_deps"\n',
        "agents.refunds.path: refunds_demo:make_deps is not a pydantic-ai Agent",
    ),
    "missing environment variable": (
        '[slack]\nbot_token = "env:SURELY_UNSET_SLACK_TOKEN"\nsigning_secret = "y"\n',
        "slack.bot_token names environment variable SURELY_UNSET_SLACK_TOKEN, which is not set",
    ),
    "unknown agent in a rule": (
        '[agents.refunds]\npath = "refunds_demo:refunds_agent"\n'
        '[[rules]]\nid = "r"\neffect = "allow"\ntool = "t"\nagent = "refund"\n',
        "rules[0].agent: agent 'refund' is not defined (did you mean 'refunds'? known: refunds)",
    ),
    "unknown queue to escalate to": (
        '[queues.default]\nescalate_to = "manager"\n[queues.managers]\n',
        "queues.default.escalate_to: queue 'manager' is not defined (did you mean 'managers'?"
        " known: default, managers)",
    ),
    "a list's item, located as in TOML": (
        '[queues.default]\nchannels = ["inbox", 3]\n',
        "queues.default.channels[1]: Input should be a valid string",
    ),
    "unknown channel kind, listed readably": (
        '[queues.default]\nchannels = ["slak:x"]\n',
        "queues.default.channels[0]: unknown channel kind 'slak' in 'slak:x' (known kinds:"
        " discord, email, inbox, slack, teams, telegram, webhook)",
    ),
}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder, as a worker's: a module beside the config imports (`-m`)."""
    (tmp_path / "broken_agent.py").write_text('raise RuntimeError("no API key here")\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("case", list(CASES))
def test_config_check_says_what_would_break_in_one_line_naming_the_file(
    folder: Path, case: str
) -> None:
    toml, message = CASES[case]
    path = folder / "approval-broker.toml"
    path.write_text(toml)
    out = runner.invoke(app, ["config", "check", str(path)])
    assert out.exit_code == 1, out.output
    assert out.stdout == ""
    [line] = out.stderr.splitlines()
    assert line.startswith(f"error: config {path}: {message}"), line
    # pydantic's wording mapped, and no Python tuple or list repr: `(known: a, b)` at most
    assert "Extra inputs are not permitted" not in line
    assert "('" not in line and "['" not in line


def test_a_role_no_queue_uses_but_unlike_any_is_fine(folder: Path) -> None:
    """A tool's `allowed_roles` may name a role no queue does: only a near miss is refused."""
    path = folder / "approval-broker.toml"
    path.write_text('[approvers.alice]\nroles = ["finance", "ops"]\n')
    out = runner.invoke(app, ["config", "check", str(path)])
    assert out.exit_code == 0, out.output
    assert "approver alice: roles finance, ops" in out.stdout


def test_an_agent_beside_the_config_imports_as_on_a_worker(folder: Path) -> None:
    (folder / "my_agents.py").write_text(
        "from pydantic_ai import Agent\nfrom pydantic_ai.models.test import TestModel\n"
        "agent = Agent(TestModel())\n"
    )
    path = folder / "approval-broker.toml"
    path.write_text('[agents.mine]\npath = "my_agents:agent"\n')
    out = runner.invoke(app, ["config", "check", str(path)])
    assert out.exit_code == 0, out.output
    assert "agent mine: my_agents:agent (queue default)" in out.stdout


def test_starting_an_unknown_agent_lists_the_known_ones(broker: Broker) -> None:
    register_agent(broker, "refunds", "refunds_demo:refunds_agent")
    with pytest.raises(NotFound) as refused:
        start_run(broker, "refund", "Refund $5 on A100")
    assert refused.value.detail == "no agent named 'refund' is registered (known: refunds)"
