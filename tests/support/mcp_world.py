"""An `up` with the MCP gateway in front of an upstream MCP server, and a person deciding for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.redis.embedded import free_port
from tests.support.live_up import AGENT, LiveUp, start_live_up
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


FAKE = str(ROOT / "tests" / "support" / "fakes" / "mcp_notes_server.py")


GATE = '["write_*", "delete_note", "archive_note"]'


@dataclass
class World:
    up: LiveUp
    tmp: Path
    env: dict[str, str]
    http_gateway: str  # the URL of the HTTP gateway's /mcp

    def runs(self, name: str) -> list[dict[str, Any]]:
        path = self.tmp / f"{name}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def config(tmp: Path, upstream_port: int) -> str:
    def stdio(log: str) -> str:
        return json.dumps([sys.executable, FAKE, "--log", str(tmp / f"{log}.jsonl")])

    return f"""
[[rules]]
id = "archiving-is-fine"
effect = "allow"
tool = "archive_note"
reason = "archiving loses nothing"

[mcp_gateways.notes_stdio]
upstream = {stdio("stdio")}
gate = {GATE}
token = "env:NOTES_GATEWAY_TOKEN"
upstream_timeout_s = 10

[mcp_gateways.notes_http]
upstream_url = "http://127.0.0.1:{upstream_port}/mcp"
gate = {GATE}
token = "env:NOTES_GATEWAY_TOKEN"
upstream_timeout_s = 10

[mcp_gateways.notes_quick]
upstream = {stdio("quick")}
gate = {GATE}
token = "env:NOTES_GATEWAY_TOKEN"
timeout_s = 1
"""


def serving(url: str) -> bool:
    try:
        return httpx.post(url, json={}, timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gateway")
    upstream_port, gateway_port = free_port(), free_port()
    up = start_live_up(tmp, config(tmp, upstream_port))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env.update(
        {
            "APPROVAL_BROKER_CONFIG": str(tmp / "broker.toml"),
            "APPROVAL_BROKER_PORT": up.url.rsplit(":", 1)[1],  # broker_url: the local up
            "NOTES_GATEWAY_TOKEN": AGENT,
        }
    )
    procs = []
    try:
        log = str(tmp / "http.jsonl")
        procs.append(subprocess.Popen([sys.executable, FAKE, "--log", log, "--http",
                                       str(upstream_port)], env=env))  # fmt: skip
        command = [sys.executable, "-m", "approval_broker", "mcp-gateway", "notes_http"]
        procs.append(subprocess.Popen([*command, "--http", str(gateway_port)], env=env, cwd=ROOT))
        url = f"http://127.0.0.1:{gateway_port}/mcp"
        wait_for(lambda: serving(url) or any(p.poll() is not None for p in procs), timeout=300)
        assert all(p.poll() is None for p in procs)
        yield World(up, tmp, env, url)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        up.stop()


def asked(world: World, name: str, tool: str) -> list[dict[str, Any]]:
    with world.up.admin() as admin:
        got = admin.get("/v1/requests", params={"status": "pending", "limit": 1000}).json()
    return [r for r in got if r["tool_name"] == tool
            and r["metadata"].get("approval_broker", {}).get("agent") == name]  # fmt: skip


def decide(world: World, name: str, tool: str, decision: dict[str, Any]) -> dict[str, Any]:
    """A person: waits for the gateway's request, checks what it carries, decides it."""
    (request,) = wait_for(lambda: asked(world, name, tool), timeout=120)
    assert request["args_schema"]["properties"].keys() >= {"name"}
    with world.up.admin() as admin:
        got = admin.post(f"/v1/requests/{request['id']}/decision", json=decision)
    assert got.status_code == 200, got.text
    return request
