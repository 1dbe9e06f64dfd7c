"""`approval-broker mcp-gateway` in front of a real upstream MCP server (tests/support/fakes), on stdio
and on Streamable HTTP, against a live `up`: gated calls wait for a person and reach the
upstream only when the broker recorded an approval; ungated ones pass at once; a dead or
silent upstream is a clear error and the gateway keeps serving."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from tests.support.mcp_client import mcp_session
from tests.support.mcp_world import ROOT, World, asked, decide  # noqa: F401
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(
    900
)  # the first test also waits for `up` to start (slow on a busy machine)


@asynccontextmanager
async def gateway(world: World, name: str) -> AsyncIterator[ClientSession]:
    """An MCP session with gateway `name`: the HTTP one running, or a stdio one started."""
    if name == "notes_http":
        async with mcp_session(world.http_gateway) as session:
            yield session
        return
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "approval_broker", "mcp-gateway", name],
        env=world.env,
        cwd=str(ROOT),
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def call_while(world: World, name: str, tool: str, args: dict[str, Any], person: Any) -> Any:
    """Call `tool` through gateway `name` while `person()` acts on another thread."""

    async def main() -> types.CallToolResult:
        async with gateway(world, name) as session:
            return await session.call_tool(tool, args)

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    result = asyncio.run(main())
    thread.join(60)
    return result


TRANSPORTS = ["notes_stdio", "notes_http"]
LOG = {"notes_stdio": "stdio", "notes_http": "http", "notes_quick": "quick"}


@pytest.mark.parametrize("name", TRANSPORTS)
def test_the_upstreams_tools_are_listed_unchanged(world: World, name: str) -> None:
    async def main() -> list[types.Tool]:
        async with gateway(world, name) as session:
            return (await session.list_tools()).tools

    tools = {t.name: t for t in asyncio.run(main())}
    assert set(tools) == {"read_note", "write_note", "delete_note", "archive_note", "hang", "die"}
    assert tools["write_note"].inputSchema["required"] == ["name", "text"]


@pytest.mark.parametrize("name", TRANSPORTS)
def test_an_approved_call_runs_once_upstream_with_the_modified_args(
    world: World, name: str
) -> None:
    def person() -> None:
        decide(world, name, "write_note",
               {"outcome": "modified", "args": {"name": "a.txt", "text": "polite"}})  # fmt: skip

    result = call_while(world, name, "write_note", {"name": "a.txt", "text": "rude"}, person)
    assert not result.isError and text(result) == "wrote 6 characters to a.txt"
    writes = [r for r in world.runs(LOG[name]) if r["tool"] == "write_note"]
    assert [w["args"] for w in writes] == [{"name": "a.txt", "text": "polite"}]


@pytest.mark.parametrize("name", TRANSPORTS)
def test_a_rejected_call_never_reaches_the_upstream_and_says_why(world: World, name: str) -> None:
    def person() -> None:
        decide(world, name, "delete_note", {"outcome": "rejected", "reason": "keep it"})

    result = call_while(world, name, "delete_note", {"name": "b.txt"}, person)
    assert result.isError and "rejected" in text(result) and "keep it" in text(result)
    assert [r for r in world.runs(LOG[name]) if r["tool"] == "delete_note"] == []


def test_a_call_nobody_decides_times_out_and_never_runs(world: World) -> None:
    result = call_while(world, "notes_quick", "delete_note", {"name": "c.txt"}, lambda: None)
    assert result.isError and "in time" in text(result)
    assert world.runs("quick") == []


@pytest.mark.parametrize("name", TRANSPORTS)
def test_a_policy_rule_decides_without_anyone(world: World, name: str) -> None:
    result = call_while(world, name, "archive_note", {"name": "d.txt"}, lambda: None)
    assert not result.isError and text(result) == "archived d.txt"
    assert [r["args"] for r in world.runs(LOG[name]) if r["tool"] == "archive_note"] == [
        {"name": "d.txt"}
    ]


@pytest.mark.parametrize("name", TRANSPORTS)
def test_an_ungated_call_passes_at_once(world: World, name: str) -> None:
    async def main() -> tuple[types.CallToolResult, float]:
        async with gateway(world, name) as session:
            start = time.monotonic()
            result = await session.call_tool("read_note", {"name": "e.txt"})
            return result, time.monotonic() - start

    result, took = asyncio.run(main())
    assert not result.isError and text(result) == "contents of e.txt"
    assert took < 10  # no request was made: nobody decides in this test
    assert asked(world, name, "read_note") == []


def test_two_people_racing_give_one_outcome_and_the_upstream_runs_at_most_once(
    world: World,
) -> None:
    name, outcomes = "notes_http", []

    def person() -> None:
        (request,) = wait_for(lambda: asked(world, name, "write_note"), timeout=120)
        barrier = threading.Barrier(2)

        def one(decision: dict[str, Any]) -> None:
            with world.up.admin() as admin:
                barrier.wait()
                got = admin.post(f"/v1/requests/{request['id']}/decision", json=decision)
                outcomes.append((decision["outcome"], got.status_code))

        people = [threading.Thread(target=one, args=({"outcome": o},)) for o in
                  ("approved", "rejected")]  # fmt: skip
        for p in people:
            p.start()
        for p in people:
            p.join(30)

    before = len([r for r in world.runs("http") if r["tool"] == "write_note"])
    result = call_while(world, name, "write_note", {"name": "race", "text": "x"}, person)
    (winner,) = [o for o, status in outcomes if status == 200]
    writes = [r for r in world.runs("http") if r["tool"] == "write_note"][before:]
    if winner == "approved":
        assert not result.isError and len(writes) == 1
    else:
        assert result.isError and writes == []


@pytest.mark.parametrize("name", TRANSPORTS)
def test_a_dead_or_silent_upstream_is_a_clear_error_and_the_gateway_keeps_serving(
    world: World, name: str
) -> None:
    async def main() -> list[types.CallToolResult]:
        async with gateway(world, name) as session:
            results = [await session.call_tool("hang", {"seconds": 120})]
            results.append(await session.call_tool("read_note", {"name": "after-hang"}))
            if name == "notes_stdio":  # an HTTP upstream that dies stays dead for the others
                results.append(await session.call_tool("die", {}))
                results.append(await session.call_tool("read_note", {"name": "after-death"}))
            return results

    results = asyncio.run(main())
    assert results[0].isError and "upstream" in text(results[0])
    assert not results[1].isError and text(results[1]) == "contents of after-hang"
    if name == "notes_stdio":
        assert results[2].isError and "upstream" in text(results[2])
        assert not results[3].isError and text(results[3]) == "contents of after-death"


@pytest.mark.parametrize("name", TRANSPORTS)
def test_a_gated_tool_the_upstream_lacks_asks_nobody(world: World, name: str) -> None:
    async def main() -> types.CallToolResult:
        async with gateway(world, name) as session:
            return await session.call_tool("write_note_v2", {"name": "x"})

    result = asyncio.run(main())
    assert result.isError and "no tool named 'write_note_v2'" in text(result)
    assert asked(world, name, "write_note_v2") == []
