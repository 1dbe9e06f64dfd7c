"""A real `approval-broker api` process for tests about processes: start it, find its URL, stop it."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

from tests.support.proc import stop_process

START_TIMEOUT_S = 180.0
"""Start-up imports the agent stack: seconds on an idle machine, far more on a loaded one."""

ADMIN = "tok-admin-of-the-api-process-tests"


def api_env(redis_url: str, tmp_path: Path, config: str | None = None) -> dict[str, str]:
    keep = {"APPROVAL_BROKER_LINK_SECRET"}  # the harness's, as a fleet's
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_") or k in keep}
    env |= {
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN,
        "APPROVAL_BROKER_DATA_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    if config is not None:
        path = tmp_path / "approval-broker.toml"
        path.write_text(config)
        env["APPROVAL_BROKER_CONFIG"] = str(path)
    return env


def spawn_api(env: dict[str, str], port: int = 0) -> subprocess.Popen[str]:
    """`approval-broker api --port PORT`, its output (stdout and stderr) on a pipe; not waited for."""
    return subprocess.Popen(
        [sys.executable, "-m", "approval_broker", "api", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def start_api(env: dict[str, str], port: int = 0) -> tuple[subprocess.Popen[str], str]:
    """`approval-broker api --port PORT`, and the URL it says it listens on."""
    proc = spawn_api(env, port)
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=0.5):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("API listening on "):
                return proc, line.removeprefix("API listening on ").strip()
    stop(proc)
    raise AssertionError(f"the API did not start: {''.join(seen)[-3000:]}")


def stop(proc: subprocess.Popen[str]) -> None:
    stop_process(proc)
