"""A live `approval-broker up` (embedded Redis, API, worker, notifier, sweeper) for tests that
drive the broker from outside: the client package, `/mcp`, the MCP gateway.

`start_live_up(tmp_path, config_toml)` starts it on a free port with a known admin token and
waits until it is healthy; `LiveUp.stop()` stops it with Ctrl-C as a user would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from broker.domain.principals import hash_token
from broker.redis.embedded import free_port
from tests.support.waiting import wait_for

ADMIN = "ab_live-up-admin-token-for-tests"
APPROVER = "ab_live-up-approver-only-token"
AGENT = "ab_live-up-requester-agent-token"

PRINCIPALS = f"""
[approvers.alice]
token_sha256 = "{hash_token(APPROVER)}"
roles = ["approver"]

[approvers.agent]
token_sha256 = "{hash_token(AGENT)}"
roles = ["requester"]
"""


@dataclass
class LiveUp:
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start_live_up(tmp_path: Path, config_toml: str = "", port: int | None = None) -> LiveUp:
    """`approval-broker up --config` with `PRINCIPALS` + `config_toml`, healthy or failed."""
    port = port or free_port()
    config = tmp_path / "broker.toml"
    config.write_text(PRINCIPALS + config_toml)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env.update(
        {
            "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN,
            "APPROVAL_BROKER_CONFIG": str(config),
            "PYTHONUNBUFFERED": "1",
        }
    )
    log = tmp_path / "up.log"
    command = [sys.executable, "-m", "approval_broker", "up", "--port", str(port)]
    command += ["--data-dir", str(tmp_path / "data")]
    proc = subprocess.Popen(
        command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True
    )
    up = LiveUp(proc, f"http://127.0.0.1:{port}", log)
    try:
        wait_for(lambda: healthy(up.url) or proc.poll() is not None, timeout=300)
        assert proc.poll() is None, log.read_text()
    except BaseException:
        up.stop()
        raise
    return up
