"""Not only Python: the official TypeScript MCP SDK (`@modelcontextprotocol/sdk`, installed
with npm into the test's temp dir) asks for approval at `/mcp` and calls a gated tool through
the gateway, while a person decides over REST."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.live_up import AGENT
from tests.support.mcp_world import World, decide  # noqa: F401
from tests.support.waiting import wait_for

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "node" / "mcp_call.mjs"


pytestmark = pytest.mark.timeout(
    900
)  # the first test also waits for `up` to start (slow on a busy machine)


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed (.ci/run installs them with apt-get)")
    where = tmp_path_factory.mktemp("node")
    (where / "package.json").write_text('{"name": "t", "private": true, "type": "module"}')
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefer-offline", "@modelcontextprotocol/sdk@1"],
        cwd=where, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shutil.copy(SCRIPT, where / SCRIPT.name)
    return where


def node_call(where: Path, url: str, token: str | None, tool: str, args: dict[str, Any]) -> Any:
    done = subprocess.run(
        ["node", SCRIPT.name, url, token or "-", tool, json.dumps(args)],
        cwd=where, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def with_person(person: Any) -> threading.Thread:
    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    return thread


def test_a_node_agent_asks_at_mcp_and_sees_the_decision(world: World, node_dir: Path) -> None:  # noqa: F811
    def person() -> None:
        def pending() -> list[dict[str, Any]]:
            with world.up.admin() as admin:
                got = admin.get("/v1/requests", params={"status": "pending"}).json()
            return [r for r in got if r["tool_name"] == "node_refund"]

        (request,) = wait_for(pending, timeout=120)
        with world.up.admin() as admin:
            admin.post(f"/v1/requests/{request['id']}/decision",
                       json={"outcome": "rejected", "reason": "not today"})  # fmt: skip

    thread = with_person(person)
    got = node_call(node_dir, f"{world.up.url}/mcp", AGENT, "request_approval",
                    {"tool_name": "node_refund", "args": {"order": "N1"}, "wait_s": 60})  # fmt: skip
    thread.join(30)
    result = got["result"]
    assert got["tools"] == ["request_approval", "ask_question", "get_request"]
    assert not result.get("isError")
    assert result["structuredContent"]["status"] == "rejected"
    assert json.loads(result["content"][0]["text"])["decision"]["reason"] == "not today"


def test_a_node_client_calls_a_gated_tool_through_the_gateway(world: World, node_dir: Path) -> None:  # noqa: F811
    thread = with_person(
        lambda: decide(world, "notes_http", "delete_note", {"outcome": "approved"})
    )
    got = node_call(node_dir, world.http_gateway, None, "delete_note", {"name": "node.txt"})
    thread.join(30)
    assert "delete_note" in got["tools"]
    assert not got["result"].get("isError")
    assert got["result"]["content"][0]["text"] == "deleted node.txt"
    assert [r["args"] for r in world.runs("http") if r["tool"] == "delete_note"][-1:] == [
        {"name": "node.txt"}
    ]
