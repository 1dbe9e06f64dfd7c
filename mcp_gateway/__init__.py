"""The MCP approval gateway: any MCP server's tools, with a person's approval in front of the
gated ones (`approval-broker mcp-gateway NAME`, `[mcp_gateways.NAME]`).

`upstream` holds the connection to the upstream MCP server, `gate` turns a gated call into a
broker request and waits for its outcome (through the client package, over the broker's HTTP
API), `server` is the MCP server clients talk to (stdio or Streamable HTTP). The broker itself
never imports this package.
"""
