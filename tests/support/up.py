"""Starting and stopping `approval-broker up` as a subprocess, and waiting for it to be healthy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from broker.redis.embedded import free_port

ADMIN = "ab_test-admin-token-for-up"


def up_command(port: int, data_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "approval_broker", "up",
        "--port", str(port), "--data-dir", str(data_dir), *extra,
    ]  # fmt: skip


def start_up(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env.update({"APPROVAL_BROKER_ADMIN_TOKEN": ADMIN, "PYTHONUNBUFFERED": "1"})
    proc = subprocess.Popen(
        up_command(port, tmp_path, *extra),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def stop_up(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return out
