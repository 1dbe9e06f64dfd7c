"""`approval-broker audit export|verify`: a whole export verifies; one byte changed, one line
removed, two lines swapped are each named, with exit status 1, by the real command (a
subprocess); exports (in process, the same typer app) since a time verify from their anchor;
the chain in Redis verifies, and a cut tail there is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import Result
from redis import Redis
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest
from broker.facade import Broker

CONFIG = """
[queues.default]
channels = ["inbox"]
"""


@pytest.fixture
def env(redis_url: str, tmp_config) -> dict[str, str]:
    return {
        **os.environ,
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_CONFIG": str(tmp_config(CONFIG)),
        "APPROVAL_BROKER_KEY_PREFIX": "t:",
    }


@pytest.fixture
def broker(redis: Redis) -> Broker:
    broker = Broker(
        redis, parse_config({"queues": {"default": {"channels": ["inbox"]}}}), prefix="t:"
    )
    for n in range(3):
        req = broker.create_request(NewRequest(tool_name="refund", args={"amount": n}))
        broker.decide(req.id, Decision(outcome="approved"), decided_by=f"person{n}")
    return broker


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "approval_broker", "audit", *args],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


def in_process(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(app, ["audit", *args], env=env)


def exported(env: dict[str, str], tmp_path: Path) -> list[str]:
    out = tmp_path / "audit.jsonl"
    done = in_process(env, "export", "-o", str(out))
    assert done.exit_code == 0, done.output
    return out.read_text().splitlines()


def verify_lines(
    env: dict[str, str], tmp_path: Path, lines: list[str]
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return cli(env, "verify", str(path))


def test_a_whole_export_verifies(env, broker, tmp_path) -> None:
    lines = exported(env, tmp_path)
    assert len(lines) == 6 and json.loads(lines[0])["event"] == "created"
    done = verify_lines(env, tmp_path, lines)
    assert done.returncode == 0 and "whole (main: 6 entries)" in done.stdout


def test_one_byte_changed_is_named(env, broker, tmp_path) -> None:
    lines = exported(env, tmp_path)
    lines[3] = lines[3].replace('"person1"', '"person9"')  # one byte of who decided
    done = verify_lines(env, tmp_path, lines)
    assert done.returncode == 1
    assert "line 4 (chain main, seq 4): entry changed" in done.stderr


def test_one_line_removed_is_named(env, broker, tmp_path) -> None:
    lines = exported(env, tmp_path)
    del lines[2]
    done = verify_lines(env, tmp_path, lines)
    assert done.returncode == 1
    assert "line 3 (chain main, seq 4): entry removed: seq 3 missing before it" in done.stderr


def test_two_lines_swapped_are_named(env, broker, tmp_path) -> None:
    lines = exported(env, tmp_path)
    lines[2], lines[3] = lines[3], lines[2]
    done = verify_lines(env, tmp_path, lines)
    assert done.returncode == 1
    assert "line 3 (chain main, seq 4): entry reordered" in done.stderr


def test_a_line_that_is_not_an_entry_is_named(env, broker, tmp_path) -> None:
    lines = exported(env, tmp_path)
    lines[1] = lines[1][:-5]
    (tmp_path / "bad.jsonl").write_text("\n".join(lines))
    done = in_process(env, "verify", str(tmp_path / "bad.jsonl"))
    assert done.exit_code == 1 and "line 2: entry invalid" in done.output


def test_an_export_since_a_time_is_anchored_at_its_first_entry(env, broker, tmp_path) -> None:
    lines = exported(env, tmp_path)
    later = json.loads(lines[3])["at"]
    out = tmp_path / "since.jsonl"
    assert in_process(env, "export", "--since", later, "-o", str(out)).exit_code == 0
    assert 0 < len(out.read_text().splitlines()) < len(lines)
    assert in_process(env, "verify", str(out)).exit_code == 0
    bad = in_process(env, "export", "--since", "yesterday")
    assert bad.exit_code != 0 and "--since: not an ISO 8601" in bad.output


def test_the_chain_in_redis_verifies_and_a_cut_tail_is_caught(env, broker, redis) -> None:
    done = in_process(env, "verify")
    assert done.exit_code == 0, done.output
    last = redis.xrevrange(broker.keys.audit, count=1)[0][0]
    redis.xdel(broker.keys.audit, last)
    cut = in_process(env, "verify")
    assert cut.exit_code == 1 and "the chain's head is seq 6, its last entry is seq 5" in cut.output
