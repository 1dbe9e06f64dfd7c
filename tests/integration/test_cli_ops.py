"""The operator commands: `--version`, `config check`, `status`, `runs show`, `webhook secret`."""

from __future__ import annotations

import base64
import json
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import start_run

runner = CliRunner()

CONFIG = """
[queues.default]
channels = ["inbox", "webhook:ops"]
escalate_to = "managers"
[queues.managers]
timeout_s = 60
quorum = 2
[webhooks.ops]
url = "http://127.0.0.1:9/hook"
secret = "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1vcHMtd2ViaG9vayE="
[approvers.alice]
token_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
roles = ["finance"]
[approvers.bob]
token_sha256 = "1111111111111111111111111111111111111111111111111111111111111111"
roles = ["finance"]
[agents.refunds]
path = "refunds_demo:refunds_agent"
[[rules]]
id = "small"
effect = "allow"
tool = "issue_refund"
args = { amount = { le = 10 } }
"""


@pytest.fixture
def env(redis_url: str, tmp_config, monkeypatch) -> str:
    path = tmp_config(CONFIG)
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("APPROVAL_BROKER_CONFIG", str(path))
    monkeypatch.setenv("APPROVAL_BROKER_KEY_PREFIX", "t:")
    return str(path)


def run(*args: str):
    return runner.invoke(app, list(args))


def test_version_prints_the_installed_version() -> None:
    out = run("--version")
    assert out.exit_code == 0
    assert out.stdout.strip() == f"approval-broker {version('approval-broker')}"


def test_config_check_prints_what_the_file_defines(env: str) -> None:
    out = run("config", "check", env)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0] == f"config {env}: ok"
    assert "queue default: inbox, webhook:ops; waits 600 s, then managers" in lines
    assert "queue managers: inbox; waits 60 s, then timed_out, quorum 2" in lines
    assert "agent refunds: refunds_demo:refunds_agent (queue default)" in lines
    assert "approver alice: roles finance" in lines
    assert "channel webhook:ops: posts to http://127.0.0.1:9/hook" in lines
    assert "rule small: allow issue_refund" in lines


def test_config_check_refuses_a_bad_file_in_one_line(tmp_config) -> None:
    bad = tmp_config('[queues.default]\nchannels = ["inbox", "slack:nowhere"]\n')
    out = run("config", "check", str(bad))
    assert out.exit_code == 1
    assert out.output.count("\n") == 1
    assert "queues.default.channels[1]" in out.output and "slack:nowhere" not in out.stdout
    missing = run("config", "check", "/nonexistent/approval-broker.toml")
    assert missing.exit_code == 1 and "cannot read it" in missing.output


def test_webhook_secret_is_a_fresh_secret_the_config_accepts() -> None:
    first, second = run("webhook", "secret"), run("webhook", "secret")
    assert first.exit_code == second.exit_code == 0
    secret = first.stdout.strip()
    assert secret.startswith("whsec_") and secret != second.stdout.strip()
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 32
    parse_config({"webhooks": {"x": {"url": "http://127.0.0.1:9/", "secret": secret}}})


def test_status_counts_pending_requests_and_dead_letters(env: str, broker: Broker) -> None:
    for _ in range(3):
        broker.create_request(NewRequest(tool_name="refund", args={"amount": 120}))
    broker.create_request(NewRequest(tool_name="refund", queue="managers"))
    broker.dead_letter("test", "a delivery that kept failing")
    out = run("status", "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["queues"] == {"default": 3, "managers": 1}
    assert report["dead_letters"] == 1
    assert report["redis"]["version"]
    text = run("status").stdout
    assert "queue default: 3 pending" in text and "dead letters: 1" in text


def test_runs_show_prints_the_run_and_refuses_an_unknown_id(env: str, broker: Broker) -> None:
    register_agent(broker, "refunds", "refunds_demo:refunds_agent")
    run_ = start_run(broker, "refunds", "Refund $5 on A100")
    out = run("runs", "show", run_.id)
    assert out.exit_code == 0, out.output
    shown = json.loads(out.stdout)
    assert shown["id"] == run_.id and shown["agent"] == "refunds" and shown["status"] == "queued"
    missing = run("runs", "show", "run_nope")
    assert missing.exit_code == 1 and missing.output.startswith("error: ")


def test_status_sums_the_worker_slots_up_and_verbose_lists_them(env: str, broker: Broker) -> None:
    """One worker process registers one RQ worker per slot: `status` says 1 process, 3 slots,
    1 busy (one slot running a job), not a line per slot; `--verbose` adds those lines."""
    from rq.worker import WorkerStatus

    from workers.slots import Slots

    slots = Slots("agent-runs", broker.rq_connection, concurrency=3)
    for worker in slots.workers:
        worker.register_birth()
        worker.set_state(WorkerStatus.IDLE)  # as a slot's loop does before it waits for work
    slots.workers[0].set_state(WorkerStatus.BUSY)
    try:
        out = run("status")
        assert out.exit_code == 0, out.output
        assert "workers: 1 process, 3 slots, 1 busy" in out.stdout.splitlines()
        assert not [ln for ln in out.stdout.splitlines() if ln.startswith("worker ")]
        verbose = run("status", "--verbose").stdout.splitlines()
        listed = sorted(ln for ln in verbose if ln.startswith("worker "))
        assert listed == sorted(
            [f"worker {w.name}: idle" for w in slots.workers[1:]]
            + [f"worker {slots.workers[0].name}: busy"]
        )
        assert json.loads(run("status", "--json").stdout)["worker_summary"] == {
            "processes": 1,
            "slots": 3,
            "busy": 1,
        }
    finally:
        slots.close()
