"""Drive an MCP server over Streamable HTTP with the official `mcp` Python client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client


@asynccontextmanager
async def mcp_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx.Timeout(30, read=120)
    async with httpx.AsyncClient(headers=headers, timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def body(result: types.CallToolResult) -> dict[str, Any]:
    """The structured result, checked to say the same as its JSON text."""
    (text,) = [c for c in result.content if isinstance(c, types.TextContent)]
    assert json.loads(text.text) == result.structuredContent
    assert result.structuredContent is not None
    return result.structuredContent
