"""`approval-broker mcp-gateway NAME [--http PORT]`: serve the MCP approval gateway of
`[mcp_gateways.NAME]` on stdio (for a desktop MCP client that starts it) or on Streamable HTTP.

Config mistakes are one line and a non-zero exit before anything starts.
"""

from __future__ import annotations

from typing import Annotated

import typer

from approval_broker.cli_common import clear_errors, load_settings


def mcp_gateway(
    name: Annotated[str, typer.Argument(help="The gateway: [mcp_gateways.NAME] in the config.")],
    http: Annotated[
        int | None,
        typer.Option(
            "--http", min=1, max=65535, help="Serve Streamable HTTP on 127.0.0.1:PORT at /mcp."
        ),
    ] = None,
) -> None:
    """Proxy an MCP server's tools; gated calls wait for a person's approval in the broker."""
    import anyio

    from mcp_gateway.run import broker_client, serve_http, serve_stdio

    settings, config = load_settings()
    with clear_errors():
        broker_client(name, config, settings)  # refuse a bad [mcp_gateways.NAME] now
    if http is None:
        anyio.run(serve_stdio, name, config, settings)
    else:
        anyio.run(serve_http, name, config, settings, http)
