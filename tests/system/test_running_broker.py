"""Commands find the broker `up` runs, from another shell with no flag and no APPROVAL_BROKER_*
variable; `status` sums the workers up; Ctrl-C stops every role at once.

`up` runs in one process (with `--data-dir` and a config of its own); each command runs in
another, in another folder, with a clean environment that shares only the user's state dir
(XDG_STATE_HOME, where `up` records itself).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.redis.embedded import free_port
from tests.support.proc import alive, descendants
from tests.support.up import ADMIN, healthy
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)

CONFIG = """
[workers]
concurrency = 3
[queues.default]
[queues.managers]
timeout_s = 60
"""

NOTHING_RUNS = (
    "error: no broker is running for this user: start `approval-broker up`, or pass --data-dir"
    " DIR (the one `up` was given), or set APPROVAL_BROKER_REDIS_URL\n"
)


def clean_env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    return env | {"XDG_STATE_HOME": str(state), "PYTHONUNBUFFERED": "1"}


class Up:
    """One `approval-broker up` in a folder of its own."""

    def __init__(self, home: Path, config: str, *args: str) -> None:
        self.home = home
        self.state = home / "state"
        self.url = f"http://127.0.0.1:{free_port()}"
        (home / "approval-broker.toml").write_text(config)
        env = clean_env(self.state) | {
            "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN,
            "APPROVAL_BROKER_CONFIG": str(home / "approval-broker.toml"),
        }
        port = self.url.rsplit(":", 1)[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "approval_broker", "up", "--port", port,
             "--data-dir", str(home / "data"), *args],
            cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        wait_for(lambda: self.records() or self.proc.poll() is not None, timeout=180)
        assert self.proc.poll() is None, self.proc.stdout.read() if self.proc.stdout else ""

    def records(self) -> list[Path]:
        return sorted((self.state / "approval-broker" / "running").glob("*.json"))

    def command(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """`approval-broker ARGS` in another shell: another folder, nothing but the state dir."""
        return subprocess.run(
            [sys.executable, "-m", "approval_broker", *args],
            cwd=cwd, env=clean_env(self.state), capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def roles(self) -> dict[int, str]:
        """The role processes `up` runs, by pid: their command's last word."""
        found = {}
        for pid in descendants(self.proc.pid):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"approval_broker" in args:
                found[pid] = args[args.index(b"approval_broker") + 1].decode()
        return found

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=60)
        return out

    def kill(self) -> None:
        family = descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in family:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    fleet = Up(tmp_path_factory.mktemp("up"), CONFIG, "--workers", "2")
    try:
        yield fleet
    finally:
        fleet.kill()


def test_up_records_where_it_runs_for_the_user(up: Up) -> None:
    [record] = up.records()
    found = json.loads(record.read_text())
    assert found["pid"] == up.proc.pid
    assert found["data_dir"] == str((up.home / "data").resolve())
    assert found["api_url"] == up.url
    assert found["config"] == str(up.home / "approval-broker.toml")
    assert record.stat().st_mode & 0o777 == 0o600  # its Redis URL carries the password


def test_status_in_another_shell_reaches_up_without_flags(up: Up, tmp_path: Path) -> None:
    out = wait_for(
        lambda: "workers: 2 processes, 6 slots" in (r := up.command("status", cwd=tmp_path)).stdout and r,  # fmt: skip
        timeout=120, interval=0.2,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "workers: 2 processes, 6 slots, 0 busy" in lines
    assert "queue managers: 0 pending" in lines  # the config `up` was given, from its record
    assert not [line for line in lines if line.startswith("worker ")]  # no line per slot


def test_status_verbose_lists_every_slot(up: Up, tmp_path: Path) -> None:
    wait_for(lambda: "6 slots" in up.command("status", cwd=tmp_path).stdout, timeout=120)
    out = up.command("status", "--verbose", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    slots = [line for line in out.stdout.splitlines() if line.startswith("worker ")]
    assert len(slots) == 6 and all(line.endswith(": idle") for line in slots), out.stdout


def test_pending_decide_runs_and_audit_reach_up_without_flags(up: Up, tmp_path: Path) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    created = httpx.post(
        f"{up.url}/v1/requests", headers=auth, timeout=10,
        json={"tool_name": "delete_user", "args": {"user": "u-7"}, "queue": "managers"},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    rid = created.json()["id"]
    pending = up.command("pending", "--queue", "managers", cwd=tmp_path)
    assert pending.returncode == 0 and rid in pending.stdout, pending.stderr
    decided = up.command("decide", rid, "approve", cwd=tmp_path)
    assert decided.returncode == 0, decided.stderr
    got = httpx.get(f"{up.url}/v1/requests/{rid}", headers=auth, timeout=10).json()
    assert got["status"] == "approved" and got["decision"]["decided_by"] == "cli"
    missing = up.command("runs", "show", "run_nope", cwd=tmp_path)
    assert missing.returncode == 1 and "no broker is running" not in missing.stderr
    assert "run_nope" in missing.stderr
    audit = up.command("audit", "verify", cwd=tmp_path)
    assert audit.returncode == 0 and audit.stdout.startswith("audit trail whole"), audit.stderr
    rules = up.command("rules", "list", cwd=tmp_path)
    assert rules.returncode == 0, rules.stderr


def test_an_explicit_data_dir_wins_over_the_record(up: Up, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    out = up.command("status", "--data-dir", str(elsewhere), cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr == (
        f"error: no broker is running with data dir {elsewhere}: start"
        f" `approval-broker up --data-dir {elsewhere}`, or set APPROVAL_BROKER_REDIS_URL\n"
    )


def test_with_nothing_running_the_error_says_what_to_pass(tmp_path: Path) -> None:
    state = tmp_path / "state"
    running = state / "approval-broker" / "running"
    running.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: the record of an `up` that was SIGKILLed
    stale = running / f"{gone.pid}.json"
    stale.write_text(json.dumps({"pid": gone.pid, "redis_url": "redis://127.0.0.1:9/0", "api_url": "http://127.0.0.1:9", "data_dir": str(tmp_path)}))  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "approval_broker", "status"],
        cwd=tmp_path, env=clean_env(state) | {"HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr == NOTHING_RUNS
    assert not stale.exists()


SLOW_AGENT = """
import asyncio
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

HERE = Path(__file__).parent


def model(messages, info):
    if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
        return ModelResponse(parts=[TextPart("done")])
    return ModelResponse(parts=[ToolCallPart("slow_step", {})])


agent = Agent(FunctionModel(model))


@agent.tool_plain
async def slow_step() -> str:
    (HERE / "started").touch()
    while not (HERE / "release").exists():  # the test says when the run in flight may end
        await asyncio.sleep(0.05)
    return "finished"
"""


def test_one_ctrl_c_stops_every_role_together_and_finishes_the_run_in_flight(
    tmp_path: Path,
) -> None:
    """The worker finishes a run in flight while the other roles have already stopped (they
    were signalled at once, not one after the other); nothing is killed."""
    (tmp_path / "slow_agent.py").write_text(SLOW_AGENT)
    config = CONFIG + '[agents.slow]\npath = "slow_agent:agent"\n'
    fleet = Up(tmp_path, config, "--workers", "1")
    try:
        wait_for(lambda: healthy(fleet.url), timeout=120)
        auth = {"Authorization": f"Bearer {ADMIN}"}
        started = httpx.post(
            f"{fleet.url}/v1/runs", headers=auth, timeout=10,
            json={"agent": "slow", "prompt": "go"},
        )  # fmt: skip
        assert started.status_code in (200, 201, 202), started.text
        wait_for(lambda: (tmp_path / "started").exists(), timeout=120)
        roles = fleet.roles()
        assert sorted(roles.values()) == ["api", "notifier", "sweeper", "worker"], roles
        [worker] = [pid for pid, name in roles.items() if name == "worker"]
        others = [pid for pid, name in roles.items() if name != "worker"]

        fleet.proc.send_signal(signal.SIGINT)  # one Ctrl-C
        wait_for(lambda: not any(alive(pid) for pid in others), timeout=60)
        assert alive(worker)  # still finishing its run, while the others are gone
        (tmp_path / "release").touch()
        out = fleet.stop()
        assert fleet.proc.returncode == 0, out
        assert "killed" not in out, out
        assert "worker: stopping; waiting for 1 run(s) in flight" in out, out
        assert not alive(worker)
        assert fleet.records() == []  # taken back on the clean exit
    finally:
        fleet.kill()


def test_up_refuses_at_start_what_config_check_finds(tmp_path: Path) -> None:
    """An agent that doesn't import is an error at `up`'s start, before any Redis or role."""
    config = tmp_path / "approval-broker.toml"
    config.write_text('[agents.refunds]\npath = "no_such_package.agents:agent"\n')
    env = clean_env(tmp_path / "state") | {
        "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN,
        "APPROVAL_BROKER_CONFIG": str(config),
    }
    done = subprocess.run(
        [sys.executable, "-m", "approval_broker", "up", "--port", str(free_port()),
         "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == (
        f"error: config {config}: agents.refunds.path: cannot import no_such_package.agents"
        " (ModuleNotFoundError: No module named 'no_such_package')\n"
    )
    assert not (tmp_path / "data" / "redis").exists()
