"""`/mcp` on a live `up`: the official MCP client asks for approval, a person decides over REST,
the client sees the outcome; bad input is a tool error with REST's `{"error","detail"}` and
creates nothing; no token is a 401."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import httpx
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from tests.support.live_up import ADMIN, AGENT, APPROVER, LiveUp, start_live_up
from tests.support.mcp_client import body, mcp_session
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(
    900
)  # the first test also waits for `up` to start (slow on a busy machine)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveUp]:
    live = start_live_up(tmp_path_factory.mktemp("up"))
    try:
        yield live
    finally:
        live.stop()


def pending(up: LiveUp, tool_name: str) -> list[dict[str, Any]]:
    with up.admin() as admin:
        got = admin.get("/v1/requests", params={"status": "pending", "limit": 1000}).json()
    return [r for r in got if r["tool_name"] == tool_name]


def decide_when_asked(up: LiveUp, tool_name: str, decision: dict[str, Any]) -> dict[str, Any]:
    (request,) = wait_for(lambda: pending(up, tool_name), timeout=30)
    with up.admin() as admin:
        got = admin.post(f"/v1/requests/{request['id']}/decision", json=decision)
    assert got.status_code == 200, got.text
    return got.json()


def test_the_server_reports_the_brokers_version_not_the_sdks(up: LiveUp) -> None:
    async def main() -> types.Implementation:
        headers = {"Authorization": f"Bearer {AGENT}"}
        async with httpx.AsyncClient(headers=headers, timeout=30) as http:
            async with streamable_http_client(f"{up.url}/mcp", http_client=http) as (r, w, _):
                async with ClientSession(r, w) as session:
                    return (await session.initialize()).serverInfo

    info = asyncio.run(main())
    assert (info.name, info.version) == ("approval-broker", version("approval-broker"))


def test_tools_are_listed(up: LiveUp) -> None:
    async def main() -> list[str]:
        async with mcp_session(f"{up.url}/mcp", AGENT) as session:
            return [t.name for t in (await session.list_tools()).tools]

    assert asyncio.run(main()) == ["request_approval", "ask_question", "get_request"]


def test_a_request_waits_for_a_decision_made_over_rest(up: LiveUp) -> None:
    async def main() -> dict[str, Any]:
        async with mcp_session(f"{up.url}/mcp", AGENT) as session:
            asked = session.call_tool(
                "request_approval",
                {"tool_name": "mcp_refund", "args": {"order": "A1"}, "wait_s": 30},
            )
            decide = asyncio.to_thread(
                decide_when_asked, up, "mcp_refund", {"outcome": "approved", "reason": "ok"}
            )
            result, _ = await asyncio.gather(asked, decide)
        assert not result.isError
        return body(result)

    got = asyncio.run(main())
    assert got["status"] == "approved" and got["args"] == {"order": "A1"}
    assert got["decision"]["reason"] == "ok" and got["created_by"] == "agent"


def test_get_request_long_polls_for_a_modified_decision(up: LiveUp) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with mcp_session(f"{up.url}/mcp", AGENT) as session:
            made = body(
                await session.call_tool(
                    "request_approval",
                    {"tool_name": "mcp_delete", "args": {"path": "/a"}, "prompt": "Delete /a?"},
                )
            )
            decide = asyncio.to_thread(
                decide_when_asked, up, "mcp_delete", {"outcome": "modified", "args": {"path": "/b"}}
            )
            got, _ = await asyncio.gather(
                session.call_tool("get_request", {"id": made["id"], "wait_s": 30}), decide
            )
            return made, body(got)

    made, got = asyncio.run(main())
    assert made["status"] == "pending" and made["prompt"] == "Delete /a?"
    assert got["status"] == "modified" and got["decision"]["args"] == {"path": "/b"}


def test_a_question_with_options_is_answered(up: LiveUp) -> None:
    answer = {"answers": [{"question": "Card or credit?", "selected": ["card"], "other": None}]}

    async def main() -> dict[str, Any]:
        async with mcp_session(f"{up.url}/mcp", AGENT) as session:
            asked = session.call_tool(
                "ask_question",
                {"question": "Card or credit?", "options": ["card", "credit"], "wait_s": 30},
            )
            decide = asyncio.to_thread(
                decide_when_asked, up, "ask_question", {"outcome": "answered", "answer": answer}
            )
            result, _ = await asyncio.gather(asked, decide)
            return body(result)

    got = asyncio.run(main())
    assert got["kind"] == "question" and got["status"] == "answered"
    assert got["decision"]["answer"] == answer


@pytest.mark.parametrize(
    ("token", "tool", "arguments", "code", "in_detail"),
    [
        (AGENT, "request_approval", {"tool_name": "bad_args", "args": [1, 2]}, "invalid", "args"),
        (AGENT, "request_approval", {"tool_name": "bad_args", "args": {}, "queue": "nowhere"},
         "unknown_queue", "nowhere"),
        (APPROVER, "request_approval", {"tool_name": "bad_args", "args": {}}, "forbidden",
         "requester"),
        (AGENT, "request_approval", {"tool_name": "bad_args", "args": {}, "wait_s": 600},
         "invalid", "wait_s"),
        (AGENT, "ask_question", {"question": "?", "options": ["only one"]}, "invalid_question",
         "options"),
        (AGENT, "get_request", {"id": "req_nope"}, "not_found", "req_nope"),
    ],
)  # fmt: skip
def test_bad_input_is_a_tool_error_with_rests_body_and_creates_nothing(
    up: LiveUp, token: str, tool: str, arguments: dict[str, Any], code: str, in_detail: str
) -> None:
    async def main() -> Any:
        async with mcp_session(f"{up.url}/mcp", token) as session:
            return await session.call_tool(tool, arguments)

    result = asyncio.run(main())
    assert result.isError
    got = body(result)
    assert got["error"] == code and in_detail in got["detail"], got
    assert pending(up, "bad_args") == []


def test_a_request_the_caller_may_not_see_is_not_found(up: LiveUp) -> None:
    with up.admin() as admin:
        made = admin.post("/v1/requests", json={"tool_name": "admins_own", "args": {}}).json()

    async def main() -> Any:
        async with mcp_session(f"{up.url}/mcp", AGENT) as session:
            return await session.call_tool("get_request", {"id": made["id"]})

    result = asyncio.run(main())
    assert result.isError and body(result)["error"] == "not_found"


def test_no_or_a_wrong_token_is_a_401(up: LiveUp) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {ADMIN}"}):
        got = httpx.post(f"{up.url}/mcp", json=hello, headers=headers, timeout=10)
        assert got.status_code == 401 and got.json()["error"] == "unauthorized"
        assert got.headers["WWW-Authenticate"] == "Bearer"
