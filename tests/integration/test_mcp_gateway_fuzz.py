"""The MCP gateway (`mcp_gateway`) under generated tool calls and hostile bodies, in process: its
Streamable HTTP app on a real uvicorn server, its real upstream (the fake notes server over
stdio), its broker a real API. A deny rule answers every gated call at once, so nothing waits.

Through the official MCP client: no call fails at the HTTP or JSON-RPC level, a gated call is
always a tool error and never reaches the upstream (its run log holds no gated tool), and no
request the broker holds was approved. Raw bodies (nested 2,000 deep, 5,000-digit numbers,
broken JSON) posted to the gateway's `/mcp` are a 4xx, never a 5xx. Bounded: `MAX_EXAMPLES`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config, parse_config
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.embedded import free_port
from broker.store.rule_sync import sync_at_start
from mcp_gateway.run import gateway_for, http_app
from tests.support.auth import person
from tests.support.hostile_json import (
    HOSTILE_BODIES,
    UNICODE_TEXT,
    UNICODE_VALUES,
    hostile_variants,
    near,
)

MAX_EXAMPLES = 60
ROOT = Path(__file__).resolve().parents[2]
FAKE = str(ROOT / "tests" / "support" / "fakes" / "mcp_notes_server.py")
TOKEN = "tok-gateway-fuzz"
GATED = ["write_*", "delete_note"]
UPSTREAM_TOOLS = ["read_note", "write_note", "delete_note", "archive_note"]  # never hang or die


def config(log: Path, broker_url: str | None = None) -> Config:
    raw: dict[str, Any] = {
        "queues": {"default": {"channels": ["inbox"]}},
        "approvers": {"gateway": person(TOKEN, ["requester"])},
        "rules": [
            {"id": f"no-writes-{i}", "effect": "deny", "tool": t, "reason": "fuzzing"}
            for i, t in enumerate(GATED)
        ],  # fmt: skip
    }
    if broker_url is not None:
        raw["mcp_gateways"] = {
            "notes": {
                "upstream": [sys.executable, FAKE, "--log", str(log)],
                "gate": GATED,
                "token": TOKEN,
                "broker_url": broker_url,
                "upstream_timeout_s": 30,
            }
        }
    return parse_config(raw)


@pytest.fixture
def api(api_broker: Broker, tmp_path: Path) -> Iterator[tuple[str, Config]]:
    cfg = config(tmp_path / "runs.jsonl")
    broker = Broker(api_broker.redis, cfg, prefix="t:")
    sync_at_start(broker.requests.rules)  # the config's [[rules]], as `approval-broker api` does
    with ServerThread(create_app(Settings(), cfg, broker)) as server:
        yield server.url, config(tmp_path / "runs.jsonl", server.url)


@asynccontextmanager
async def gateway_served(cfg: Config) -> AsyncIterator[str]:
    """Gateway `notes` on uvicorn (in this event loop), until left: its `/mcp` URL."""
    async with gateway_for("notes", cfg, Settings()) as gateway:
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(http_app(gateway), host="127.0.0.1", port=port, log_level="warning")
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve)
            while not server.started:  # polled: uvicorn says when it listens
                await anyio.sleep(0.01)
            try:
                yield f"http://127.0.0.1:{port}/mcp"
            finally:
                server.should_exit = True


@asynccontextmanager
async def session_at(url: str, statuses: list[int]) -> AsyncIterator[ClientSession]:
    async def record(response: httpx.Response) -> None:
        statuses.append(response.status_code)

    async with httpx.AsyncClient(timeout=60, event_hooks={"response": [record]}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def arguments() -> st.SearchStrategy[dict[str, Any]]:
    valid = {"name": "n1", "text": "hello"}
    return st.one_of(
        st.just(valid),
        near(valid, values=UNICODE_VALUES),
        st.dictionaries(UNICODE_TEXT, UNICODE_VALUES, max_size=3),
    )


def ran(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line)["tool"] for line in lines]


def test_the_gateway_forwards_no_gated_call_and_never_fails_on_generated_input(
    api: tuple[str, Config], api_broker: Broker, tmp_path: Path
) -> None:
    _, cfg = api
    log = tmp_path / "runs.jsonl"
    statuses: list[int] = []
    outcomes: dict[str, int] = {}
    with ExitStack() as stack:
        portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
        url = stack.enter_context(portal.wrap_async_context_manager(gateway_served(cfg)))
        session = stack.enter_context(portal.wrap_async_context_manager(session_at(url, statuses)))

        for body in [*HOSTILE_BODIES, *hostile_variants({"name": "n1", "text": "t"})]:
            envelope = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "write_note", "arguments": "ARGS"}}  # fmt: skip
            for raw in (body, json.dumps(envelope).replace('"ARGS"', body)):
                resp = httpx.post(url, content=raw.encode("utf-8", "surrogatepass"), timeout=60,
                                  headers={"content-type": "application/json",
                                           "accept": "application/json, text/event-stream"})  # fmt: skip
                assert resp.status_code < 500, (raw[:200], resp.text[:200])

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(pick=st.sampled_from([*UPSTREAM_TOOLS, None]), data=st.data())
        def run(pick: str | None, data: Any) -> None:
            name = pick or data.draw(UNICODE_TEXT.filter(lambda t: t not in ("hang", "die")))
            args = data.draw(arguments())
            result: types.CallToolResult = portal.call(session.call_tool, name, args)
            gated = any(name == g or (g.endswith("*") and name.startswith(g[:-1])) for g in GATED)
            kind = f"{name if name in UPSTREAM_TOOLS else 'other'}:{'error' if result.isError else 'ok'}"
            outcomes[kind] = outcomes.get(kind, 0) + 1
            if gated:
                assert result.isError, (name, args, result)

        run()
    print("tool outcomes:", dict(sorted(outcomes.items())))
    assert statuses and all(s < 400 for s in statuses), sorted(set(statuses))
    assert not {"write_note", "delete_note"} & set(ran(log)), ran(log)
    assert outcomes.get("read_note:ok") and outcomes.get("write_note:error")
    held = api_broker.list_requests(limit=1000)
    assert held and all(r.status.value == "rejected" for r in held), [r.status for r in held]
