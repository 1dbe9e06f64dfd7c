"""The ops commands: real output, one-line errors with non-zero exit, nothing written on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.domain.models import NewRequest, Status
from broker.domain.principals import hash_token
from broker.facade import Broker

runner = CliRunner()


@pytest.fixture
def env(redis_url: str, tmp_config, monkeypatch) -> dict[str, str]:
    path = tmp_config(
        '[queues.default]\nescalate_to = "managers"\n[queues.managers]\ntimeout_s = 60\n'
    )
    values = {"APPROVAL_BROKER_REDIS_URL": redis_url, "APPROVAL_BROKER_CONFIG": str(path)}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("APPROVAL_BROKER_KEY_PREFIX", "t:")
    return values


def run(*args: str):
    return runner.invoke(app, list(args))


def test_pending_and_decide(env, broker: Broker):
    a = broker.create_request(NewRequest(tool_name="refund", args={"amount": 120}))
    b = broker.create_request(NewRequest(tool_name="ask", kind="question", prompt="Which colour?"))
    out = run("pending")
    assert out.exit_code == 0
    assert a.id in out.stdout and "refund" in out.stdout and "Which colour?" in out.stdout
    lines = run("pending", "--json").stdout.splitlines()
    assert {json.loads(line)["id"] for line in lines} == {a.id, b.id}

    out = run("decide", a.id, "modify", "--args", '{"amount": 50}', "--by", "alice")
    assert out.exit_code == 0 and f"{a.id}: modified" in out.stdout
    assert broker.get_request(a.id).decision.args == {"amount": 50}
    out = run("decide", b.id, "answer", "--answer", "blue")
    assert out.exit_code == 0
    assert broker.get_request(b.id).decision.answer == "blue"
    assert run("pending").stdout.strip() == "nothing pending"


def test_escalate_from_cli(env, broker: Broker):
    a = broker.create_request(NewRequest(tool_name="refund"))
    out = run("decide", a.id, "escalate", "--reason", "over my limit")
    assert out.exit_code == 0 and "pending (queue managers)" in out.stdout
    assert broker.get_request(a.id).history[0].reason == "over my limit"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["decide", "req_nope", "approve"], "no request with id 'req_nope'"),
        (["decide", "ID", "modify"], "needs 'args'"),
        (["decide", "ID", "modify", "--args", "{bad"], "--args is not valid JSON"),
        (
            ["decide", "ID", "answer", "--answer", "1"],
            "does not apply to a request of kind 'approval'",
        ),
        (["decide", "ID", "escalate", "--target", "nowhere"], "queue 'nowhere' is not defined"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(env, broker: Broker, args, message):
    request = broker.create_request(NewRequest(tool_name="refund"))
    args = [request.id if a == "ID" else a for a in args]
    out = run(*args)
    assert out.exit_code != 0
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.output
    assert broker.get_request(request.id).status is Status.pending


def test_decided_twice_names_the_winner(env, broker: Broker):
    request = broker.create_request(NewRequest(tool_name="refund"))
    assert run("decide", request.id, "approve", "--by", "alice").exit_code == 0
    out = run("decide", request.id, "reject", "--by", "bob")
    assert (
        out.exit_code == 1
        and "already approved" in out.stderr
        and '"decided_by": "alice"' in out.stderr
    )


def test_broken_config_is_one_line(redis_url, tmp_config, monkeypatch):
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv(
        "APPROVAL_BROKER_CONFIG", str(tmp_config('[queues.default]\nescalate_to = "x"\n'))
    )
    out = run("pending")
    assert out.exit_code == 1
    assert out.stderr.strip().endswith(
        "queues.default.escalate_to: queue 'x' is not defined (known: default)"
    )


def test_unreachable_redis_is_one_line(monkeypatch):
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_URL", "redis://127.0.0.1:1/0")
    out = run("pending")
    assert (
        out.exit_code == 1
        and out.stderr.startswith("error: Redis:")
        and "Traceback" not in out.output
    )


def test_token_new_prints_a_matching_config_line():
    out = run("token", "new", "alice")
    assert out.exit_code == 0
    token = out.stdout.split("keep it secret): ")[1].split()[0]
    assert f'token_sha256 = "{hash_token(token)}"' in out.stdout
    assert "[approvers.alice]" in out.stdout
    bad = run("token", "new", "al ice")
    assert bad.exit_code == 1 and "may hold only" in bad.stderr


def test_console_script_help_everywhere():
    for args in ([], ["decide"], ["pending"], ["token", "new"], ["up"], ["dead-letters"]):
        proc = subprocess.run(
            [sys.executable, "-m", "approval_broker", *args, "--help"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Usage" in proc.stdout
