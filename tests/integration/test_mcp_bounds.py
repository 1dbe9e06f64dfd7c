"""`/mcp` reads a POST body within the API's bounds before the `mcp` SDK sees it
(`api.mcp_bounds`): arguments nested 2,000 deep, or an integer of 5,000 digits, are a 4xx
`{"error", "detail"}` and create nothing (the SDK answered 500: a RecursionError, a ValueError);
arguments as deep as REST allows still reach the tool. Also `GET /mcp`: streams per principal
are capped like `/v1/events` (429 beyond), through a real uvicorn server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.events import EventsSettings
from api.testing import ServerThread
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.decisions import snapshot
from tests.support.waiting import wait_for

AGENT, OTHER = "tok-agent-mcp-bounds", "tok-other-mcp-bounds"
API_CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "approvers": {
        "agent": person(AGENT, ["requester"]),
        "other": person(OTHER, ["requester"]),
    },
}
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-06-18",
}


def call(arguments_json: str) -> str:
    """A `tools/call` of `request_approval` whose `args` are `arguments_json`, as text (a
    body nested 2,000 deep can't be built with `json.dumps` under the recursion limit)."""
    envelope = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "request_approval", "arguments": {"tool_name": "t", "args": "ARGS"}},
    }
    return json.dumps(envelope).replace('"ARGS"', arguments_json)


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def post(client: TestClient, body: str, token: str = AGENT) -> httpx.Response:
    return client.post(
        "/mcp", content=body, headers={**HEADERS, "Authorization": f"Bearer {token}"}
    )


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (nested(2000), "too_deep"),  # the issue's
        (nested(64), "too_deep"),  # one deeper than REST's bound
        ('{"n": ' + "9" * 5000 + "}", "invalid_json"),  # past Python's 4,300 digits
        ('{"amount": 1e999}', "invalid"),  # the SDK made it null: a request for other args
        ('{"note": "\\ud800"}', "invalid"),  # a lone surrogate, as REST refuses it
    ],
    ids=["2000-deep", "64-deep", "5000-digits", "past-a-double", "lone-surrogate"],
)
def test_a_body_past_the_bounds_is_a_4xx_and_creates_nothing(
    args: str, code: str, client: TestClient, api_broker: Broker
) -> None:
    before = snapshot(api_broker.redis)
    resp = post(client, call(args))
    assert 400 <= resp.status_code < 500, resp.text
    assert resp.json()["error"] == code and resp.json()["detail"]
    assert snapshot(api_broker.redis) == before


def test_arguments_as_deep_as_rest_allows_reach_the_tool(
    client: TestClient, api_broker: Broker
) -> None:
    """63 deep: the most `POST /v1/requests` takes (the body 64 deep); so does `/mcp`."""
    rest = client.post(
        "/v1/requests",
        json={"tool_name": "t", "args": json.loads(nested(63))},
        headers={"Authorization": f"Bearer {AGENT}"},
    )
    assert rest.status_code == 201, rest.text
    ok = post(client, call(nested(63)))
    assert ok.status_code == 200, ok.text
    result = ok.json()["result"]
    assert not result["isError"], result
    assert api_broker.get_request(result["structuredContent"]["id"]).is_pending


# ---- GET /mcp streams ----------------------------------------------------------------------

LIMIT = 3


@pytest.fixture
def server_url(api_broker: Broker, cfg: Config) -> Iterator[str]:
    events = EventsSettings(max_streams_per_principal=LIMIT)
    app = create_app(Settings(), cfg, api_broker, events_settings=events)
    with ServerThread(app) as server:
        yield server.url


def open_stream(stack: ExitStack, client: httpx.Client, token: str) -> httpx.Response:
    headers = {"accept": "text/event-stream", "Authorization": f"Bearer {token}"}
    return stack.enter_context(client.stream("GET", "/mcp", headers=headers))


def test_get_mcp_streams_are_capped_per_principal(server_url: str) -> None:
    limits = httpx.Limits(max_connections=20)
    with httpx.Client(base_url=server_url, timeout=10, limits=limits) as client:
        with ExitStack() as stack:
            held = [open_stream(stack, client, AGENT) for _ in range(LIMIT)]
            assert [r.status_code for r in held] == [200] * LIMIT
            refused = client.get("/mcp", headers={"accept": "text/event-stream",
                                                   "Authorization": f"Bearer {AGENT}"})  # fmt: skip
            assert refused.status_code == 429, refused.text
            body: dict[str, Any] = refused.json()
            assert body["error"] == "too_many_streams" and refused.headers["retry-after"]
            assert open_stream(stack, client, OTHER).status_code == 200  # per principal
            held[0].close()  # a stream that ends gives its slot back

            def reopened() -> bool:
                with client.stream("GET", "/mcp", headers={"accept": "text/event-stream",
                                   "Authorization": f"Bearer {AGENT}"}) as again:  # fmt: skip
                    return again.status_code == 200

            wait_for(reopened, timeout=10)
