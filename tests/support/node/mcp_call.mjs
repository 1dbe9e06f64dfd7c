// Call one tool of an MCP server over Streamable HTTP with the official TypeScript SDK and
// print the result as JSON: node mcp_call.mjs URL TOKEN|- TOOL ARGS_JSON
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, tool, args] = process.argv.slice(2);
const headers = token === "-" ? {} : { Authorization: `Bearer ${token}` };
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
const client = new Client({ name: "approval-broker-node-test", version: "1.0.0" });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name);
const result = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, {
  timeout: 180_000,
});
console.log(JSON.stringify({ tools, result }));
await client.close();
