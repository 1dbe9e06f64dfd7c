"""The gateway's connection to its upstream MCP server: a stdio command or a Streamable HTTP
URL, through the `mcp` SDK's client.

One session, held open by a task of its own (the SDK's transports must be entered and left in
the same task). A call that fails at the protocol level (the upstream died, closed the pipe, or
didn't answer within `timeout_s`) drops the session and raises `UpstreamError`; the next call
connects again, so one dead upstream never stops the gateway.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import httpx
from anyio.abc import TaskGroup
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from broker.domain.config_sections import McpGatewayConfig

log = logging.getLogger("approval_broker.mcp_gateway")

CONNECT_TIMEOUT_S = 120.0
"""How long an upstream may take to start and initialize (a cold interpreter can be slow)."""


class UpstreamError(Exception):
    """The upstream could not be reached or did not answer; the message says which and why."""


def why(exc: BaseException) -> str:
    """The first real error inside the task groups of the SDK's transports, as one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    return str(exc) or type(exc).__name__


@asynccontextmanager
async def _http_streams(url: str) -> AsyncIterator[tuple[Any, Any]]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=3600)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            yield read, write


@asynccontextmanager
async def _stdio_streams(command: list[str]) -> AsyncIterator[tuple[Any, Any]]:
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(params) as (read, write):
        yield read, write


class Upstream:
    """The upstream MCP server of one gateway; `start(task_group)` before the first call."""

    def __init__(self, config: McpGatewayConfig) -> None:
        self.config = config
        self.timeout = timedelta(seconds=config.upstream_timeout_s)
        self.where = config.upstream_url or " ".join(config.upstream or [])
        self._tasks: TaskGroup | None = None
        self._session: ClientSession | None = None
        self._drop: anyio.Event | None = None
        self._lock = anyio.Lock()

    def start(self, tasks: TaskGroup) -> None:
        self._tasks = tasks

    def _streams(self) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        if self.config.upstream_url is not None:
            return _http_streams(self.config.upstream_url)
        assert self.config.upstream is not None
        return _stdio_streams(self.config.upstream)

    async def _hold(self, ready: anyio.Event, failed: list[BaseException]) -> None:
        """Open a session, keep it until it is dropped, then close it (all in this task)."""
        drop = anyio.Event()
        try:
            async with self._streams() as (read, write):
                async with ClientSession(read, write) as s:
                    with anyio.fail_after(CONNECT_TIMEOUT_S):
                        await s.initialize()
                    self._session, self._drop = s, drop
                    ready.set()
                    await drop.wait()
        except Exception as exc:  # the SDK's and the OS's errors alike: the upstream is away
            failed.append(exc)
            log.warning("upstream %s: %s", self.where, why(exc))
        finally:
            if self._drop is drop:
                self._session, self._drop = None, None
            ready.set()

    async def session(self) -> ClientSession:
        """The open session, connecting first if there is none."""
        async with self._lock:
            if self._session is None:
                assert self._tasks is not None, "Upstream.start() was not called"
                ready = anyio.Event()
                failed: list[BaseException] = []
                self._tasks.start_soon(self._hold, ready, failed)
                await ready.wait()
                if self._session is None:
                    reason = why(failed[0]) if failed else "it did not start"
                    raise UpstreamError(
                        f"the upstream MCP server ({self.where}) is not reachable: {reason}"
                    )
            return self._session

    def drop(self) -> None:
        """Close the session (after a failed call); the next call connects again."""
        if self._drop is not None:
            self._drop.set()
            self._session, self._drop = None, None

    async def list_tools(self) -> list[types.Tool]:
        """Every tool of the upstream, all pages."""
        session = await self.session()
        try:
            tools: list[types.Tool] = []
            cursor: str | None = None
            while True:
                with anyio.fail_after(CONNECT_TIMEOUT_S):
                    page = await session.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.nextCursor
                if not cursor:
                    return tools
        except Exception as exc:
            self.drop()
            raise UpstreamError(
                f"the upstream MCP server ({self.where}) failed: {why(exc)}"
            ) from exc

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        session = await self.session()
        try:
            return await session.call_tool(name, arguments, read_timeout_seconds=self.timeout)
        except Exception as exc:
            self.drop()
            raise UpstreamError(
                f"the upstream MCP server ({self.where}) failed on {name!r}: {why(exc)}"
            ) from exc
