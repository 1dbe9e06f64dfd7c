"""Benchmark the MCP approval gateway: the latency it adds to an ungated call, and the time from
a person's decision to the upstream's result for a gated one.

Starts an embedded Redis, `approval-broker api`, a small upstream MCP server
(tests/support/fakes/mcp_notes_server.py, Streamable HTTP) and `approval-broker mcp-gateway bench --http`
in front of it. With the official `mcp` client, in one session each:

1. ungated: `read_note` straight to the upstream, and the same through the gateway; p50/p99 of
   each and what the gateway adds;
2. gated: `write_note` through the gateway while a person (this process) approves over REST as
   soon as the request shows; the time from sending the decision to the call's result.

Usage: uv run python bench/bench_mcp_gateway.py [--calls 200] [--gated 30]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
from benchlib import CLI, bench_site, pct, start_role, stop_roles
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from broker.domain.principals import hash_token
from broker.redis.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fakes" / "mcp_notes_server.py"
ADMIN = "ab_bench-admin-token-for-the-gateway"
AGENT = "ab_bench-gateway-requester-token"


def config(upstream_port: int) -> str:
    return f"""
[approvers.gateway]
token_sha256 = "{hash_token(AGENT)}"
roles = ["requester"]

[mcp_gateways.bench]
upstream_url = "http://127.0.0.1:{upstream_port}/mcp"
gate = ["write_*"]
token = "env:BENCH_GATEWAY_TOKEN"
"""


def wait_serving(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.post(url, json={}, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {timeout} s")


async def timed_calls(url: str, tool: str, n: int) -> list[float]:
    """`n` calls of `tool` in one MCP session, each timed (ms); the first few warm up."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=120)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for i in range(5):
                    await session.call_tool(tool, {"name": f"warm-{i}"})
                took = []
                for i in range(n):
                    start = time.perf_counter()
                    result = await session.call_tool(tool, {"name": f"n-{i}"})
                    took.append((time.perf_counter() - start) * 1000)
                    assert not result.isError, result
                return took


async def gated_calls(gateway: str, api: str, n: int) -> list[float]:
    """Decision sent -> the gated call's upstream result, in ms, `n` times."""
    took = []
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with (
        httpx.AsyncClient(base_url=api, headers=headers, timeout=30) as admin,
        httpx.AsyncClient(timeout=httpx.Timeout(30, read=120)) as http,
        streamable_http_client(gateway, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for i in range(n):
            call = asyncio.create_task(
                session.call_tool("write_note", {"name": f"g-{i}", "text": "x"})
            )
            while True:
                pending = (await admin.get("/v1/requests", params={"status": "pending"})).json()
                mine = [r for r in pending if r["args"].get("name") == f"g-{i}"]
                if mine:
                    break
                await asyncio.sleep(0.005)
            start = time.perf_counter()
            decided = await admin.post(
                f"/v1/requests/{mine[0]['id']}/decision", json={"outcome": "approved"}
            )
            assert decided.status_code == 200, decided.text
            result = await call
            took.append((time.perf_counter() - start) * 1000)
            assert not result.isError, result
    return took


def line(label: str, values: list[float]) -> str:
    return f"{label:<58} p50 {pct(values, 0.5):7.2f} ms   p99 {pct(values, 0.99):7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--gated", type=int, default=30)
    opts = parser.parse_args()
    upstream_port, api_port, gateway_port = free_port(), free_port(), free_port()
    with bench_site(config(upstream_port)) as (env, _, _, tmp):
        env = {**env, "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN, "BENCH_GATEWAY_TOKEN": AGENT,
               "APPROVAL_BROKER_PORT": str(api_port)}  # fmt: skip
        procs: list[subprocess.Popen[str]] = []
        try:
            api, _ = start_role(["api", "--port", str(api_port)], env, "API listening on")
            procs.append(api)
            log = str(tmp / "runs.jsonl")
            procs.append(subprocess.Popen(
                [sys.executable, str(FAKE), "--log", log, "--http", str(upstream_port)],
                env=env, stderr=subprocess.DEVNULL, text=True,
            ))  # fmt: skip
            procs.append(subprocess.Popen(
                [*CLI, "mcp-gateway", "bench", "--http", str(gateway_port)], env=env, text=True
            ))  # fmt: skip
            upstream = f"http://127.0.0.1:{upstream_port}/mcp"
            gateway = f"http://127.0.0.1:{gateway_port}/mcp"
            wait_serving(upstream)
            wait_serving(gateway)
            direct = asyncio.run(timed_calls(upstream, "read_note", opts.calls))
            through = asyncio.run(timed_calls(gateway, "read_note", opts.calls))
            print(line("ungated read_note, straight to the upstream", direct))
            print(line("ungated read_note, through the gateway", through))
            print(
                f"{'added by the gateway':<58} p50 {pct(through, 0.5) - pct(direct, 0.5):7.2f} ms"
                f"   p99 {pct(through, 0.99) - pct(direct, 0.99):7.2f} ms"
            )
            gated = asyncio.run(gated_calls(gateway, f"http://127.0.0.1:{api_port}", opts.gated))
            print(line("gated write_note: decision sent -> upstream result", gated))
        finally:
            stop_roles(*procs)


if __name__ == "__main__":
    main()
