"""`/mcp` under generated tool calls, through the official MCP Python SDK client against a real
uvicorn server (arguments it can send: valid Unicode; raw bodies carry the rest): no call fails at the HTTP or JSON-RPC level (the client would raise), a refused
call is a tool error carrying `{"error", "detail"}` and changes nothing in Redis, and a caller
without `requester` creates nothing at all. Raw hostile bodies (nested 2,000 deep, 5,000-digit
numbers, broken JSON) posted beside the SDK get a 4xx. Bounded: `MAX_EXAMPLES`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from typing import Any

import anyio.from_thread
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.decisions import snapshot
from tests.support.hostile_json import (
    HOSTILE_BODIES,
    UNICODE_TEXT,
    UNICODE_VALUES,
    hostile_variants,
    near,
)

MAX_EXAMPLES = 120
AGENT, APPROVER = "tok-agent-mcp-fuzz", "tok-approver-mcp-fuzz"
API_CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}, "pair": {"channels": ["inbox"], "quorum": 2}},
    "approvers": {
        "agent": person(AGENT, ["requester"]),
        "ann": person(APPROVER, ["finance"]),  # decides, but may not ask
    },
}
TOOLS = ["request_approval", "ask_question", "get_request"]
VALID = {
    "request_approval": {
        "tool_name": "wire",
        "args": {"amount": 1},
        "prompt": "Pay?",
        "queue": "default",
        "timeout_s": 60,
        "allowed_roles": ["finance"],
        "wait_s": 0,
    },  # fmt: skip
    "ask_question": {
        "question": "Which?",
        "options": ["A", "B"],
        "queue": "default",
        "answer_schema": {"type": "object"},
        "wait_s": 0,
    },  # fmt: skip
    "get_request": {"id": "REQUEST_ID", "wait_s": 0},
}


@asynccontextmanager
async def session_with(url: str, token: str, statuses: list[int]) -> AsyncIterator[ClientSession]:
    """An SDK session whose HTTP answers are recorded in `statuses`."""

    async def record(response: httpx.Response) -> None:
        statuses.append(response.status_code)

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        headers=headers, timeout=httpx.Timeout(30), event_hooks={"response": [record]}
    ) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


@pytest.fixture
def server(api_broker: Broker, cfg: Config) -> Iterator[str]:
    with ServerThread(create_app(Settings(), cfg, api_broker)) as running:
        yield running.url


def arguments(tool: str, request_id: str) -> st.SearchStrategy[dict[str, Any]]:
    valid = {k: (request_id if v == "REQUEST_ID" else v) for k, v in VALID[tool].items()}
    one_changed = st.sampled_from(sorted(valid)).flatmap(
        lambda key: UNICODE_VALUES.map(lambda value: {**valid, key: value})
    )
    return st.one_of(
        st.just(valid),
        one_changed,
        near(valid, values=UNICODE_VALUES),
        st.dictionaries(UNICODE_TEXT, UNICODE_VALUES, max_size=4),
    )


def short_waits(args: dict[str, Any]) -> dict[str, Any]:
    """Generated `wait_s` kept from long-polling (a hostile value stays as it is)."""
    wait = args.get("wait_s")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and 0.05 < wait <= 60:
        return {**args, "wait_s": 0.05}
    return args


def test_no_generated_tool_call_fails_and_a_refused_one_changes_nothing(
    server: str, api_broker: Broker
) -> None:
    existing = api_broker.create_request(NewRequest(tool_name="t", args={}, created_by="agent"))
    statuses: list[int] = []
    outcomes: dict[str, int] = {}
    with ExitStack() as stack:
        portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
        sessions = {
            token: stack.enter_context(
                portal.wrap_async_context_manager(session_with(f"{server}/mcp", token, statuses))
            )
            for token in (AGENT, APPROVER)
        }

        def call(token: str, tool: str, args: dict[str, Any]) -> None:
            before = snapshot(api_broker.redis)
            result: types.CallToolResult = portal.call(sessions[token].call_tool, tool, args)
            body = result.structuredContent or {}
            seen = f"{tool if tool in TOOLS else 'other'}:{'error' if result.isError else 'ok'}"
            outcomes[seen] = outcomes.get(seen, 0) + 1
            if result.isError or token == APPROVER or tool == "get_request":
                assert not (token == APPROVER and tool != "get_request" and not result.isError)
                assert snapshot(api_broker.redis) == before, (tool, args, body)
            if result.isError:
                assert body.get("error") and body.get("detail"), body
                assert body["error"] != "internal", (tool, args, body)

        for tool in TOOLS:  # each field of a valid call made hostile in turn
            valid = {k: (existing.id if v == "REQUEST_ID" else v) for k, v in VALID[tool].items()}
            for body in hostile_variants(valid):
                before = snapshot(api_broker.redis)
                raw = httpx.post(f"{server}/mcp", content=_call(tool, body), headers=_headers())
                assert raw.status_code < 500, (body[:200], raw.text[:200])
                assert raw.status_code >= 400 or raw.json()["result"]["isError"], (tool, body[:300])
                assert snapshot(api_broker.redis) == before, body[:200]

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            token=st.sampled_from([AGENT, APPROVER]),
            pick=st.sampled_from([*TOOLS, *TOOLS, *TOOLS, None]),  # None: a made-up name
            data=st.data(),
        )
        def run(token: str, pick: str | None, data: Any) -> None:
            tool = pick or data.draw(UNICODE_TEXT.filter(bool))
            args = data.draw(arguments(tool if tool in TOOLS else "get_request", existing.id))
            call(token, tool, short_waits(args))

        run()
    print("tool outcomes:", dict(sorted(outcomes.items())))
    assert statuses and all(s < 400 for s in statuses), sorted(set(statuses))
    assert outcomes.get("request_approval:ok") and outcomes.get("request_approval:error")
    assert api_broker.get_request(existing.id).is_pending


def _headers() -> dict[str, str]:
    return {
        "Authorization": f"Bearer {AGENT}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2025-06-18",
    }


def _call(tool: str, arguments_json: str) -> str:
    return (
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "'
        + tool
        + '", "arguments": '
        + arguments_json
        + "}}"
    )


@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
def test_a_hostile_body_beside_the_sdk_is_never_a_5xx(
    body: str, server: str, api_broker: Broker
) -> None:
    before = snapshot(api_broker.redis)
    for raw in (body, _call("request_approval", body)):
        resp = httpx.post(f"{server}/mcp", content=raw.encode("utf-8", "surrogatepass"),
                          headers=_headers(), timeout=30)  # fmt: skip
        assert resp.status_code < 500, (raw[:200], resp.text[:200])
    assert snapshot(api_broker.redis) == before
