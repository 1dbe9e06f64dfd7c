"""The gateway's MCP server: the upstream's tools, listed unchanged; gated calls approved first.

A call of a gated tool becomes a broker request (`gate`); it is forwarded to the upstream only
on approved or modified (with the modified args), else it is a tool error whose text says why.
A tool the upstream doesn't have is refused before anything is asked. Ungated calls pass
straight through. Every failure (upstream away, broker away, bad args) is a tool error for that
call only: the gateway keeps serving.
"""

from __future__ import annotations

import logging
from importlib.metadata import version
from typing import Any

import httpx
from approval_broker_client import BrokerError
from mcp import types
from mcp.server.lowlevel import Server

from mcp_gateway.gate import Gate
from mcp_gateway.upstream import Upstream, UpstreamError

log = logging.getLogger("approval_broker.mcp_gateway")


def tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)


class Gateway:
    """One gateway: its upstream, its gate, and the MCP server in front of them."""

    def __init__(self, name: str, upstream: Upstream, gate: Gate) -> None:
        self.name = name
        self.upstream = upstream
        self.gate = gate
        self.tools: dict[str, types.Tool] = {}

    async def list_tools(self) -> list[types.Tool]:
        tools = await self.upstream.list_tools()
        self.tools = {t.name: t for t in tools}
        return tools

    async def _tool(self, name: str) -> types.Tool | None:
        if name not in self.tools:
            await self.list_tools()  # the upstream may have gained it since the last listing
        return self.tools.get(name)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            if not self.gate.gated(name):
                return await self.upstream.call_tool(name, arguments)
            tool = await self._tool(name)
            if tool is None:
                return tool_error(f"the upstream MCP server has no tool named {name!r}")
            verdict = await self.gate.ask(name, arguments, tool.inputSchema or None)
            if not verdict.run:
                return tool_error(verdict.reason)
            return await self.upstream.call_tool(name, verdict.args)
        except UpstreamError as exc:
            return tool_error(str(exc))
        except BrokerError as exc:
            return tool_error(f"the approval broker refused the request ({exc.code}): {exc}")
        except (httpx.HTTPError, OSError) as exc:
            return tool_error(f"the approval broker is not reachable: {exc}")
        except ValueError as exc:  # a call the broker's request model refuses (a name too long)
            return tool_error(f"the call can't be asked about: {exc}")

    def server(self) -> Server[Any, Any]:
        server: Server[Any, Any] = Server(
            f"approval-gateway-{self.name}", version=version("approval-broker")
        )

        @server.list_tools()
        async def list_tools() -> list[types.Tool]:
            return await self.list_tools()

        @server.call_tool(validate_input=False)  # the upstream validates its own input
        async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
            return await self.call_tool(name, arguments)

        return server
