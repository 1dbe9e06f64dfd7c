// A TypeScript agent that asks a person before it runs a risky tool call.
//
// It connects to approval-broker's MCP endpoint (/mcp) with the official SDK, asks for approval
// of `delete_customer`, waits (long-polls, 60 s at a time) until a person decides in Slack,
// email, the inbox or over REST, and runs the call only when the broker says approved or
// modified (with the modified args).
//
//   APPROVAL_BROKER_URL=http://127.0.0.1:8000 APPROVAL_BROKER_TOKEN=ab_... npm start
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

type Request = {
  id: string;
  status: "pending" | "approved" | "modified" | "rejected" | "timed_out" | "answered";
  args: Record<string, unknown>;
  decision?: { args?: Record<string, unknown>; reason?: string; decided_by?: string };
};

const url = process.env.APPROVAL_BROKER_URL ?? "http://127.0.0.1:8000";
const token = process.env.APPROVAL_BROKER_TOKEN;
if (!token) throw new Error("set APPROVAL_BROKER_TOKEN to a token with the role 'requester'");

const client = new Client({ name: "typescript-agent", version: "1.0.0" });
await client.connect(
  new StreamableHTTPClientTransport(new URL("/mcp", url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  }),
);

async function call(tool: string, args: Record<string, unknown>): Promise<Request> {
  const result = await client.callTool({ name: tool, arguments: args }, undefined, {
    timeout: 90_000,
  });
  if (result.isError) throw new Error(`${tool}: ${JSON.stringify(result.structuredContent)}`);
  return result.structuredContent as Request;
}

function deleteCustomer(args: Record<string, unknown>): string {
  return `deleted customer ${args.customer_id}`; // the real, risky work goes here
}

let request = await call("request_approval", {
  tool_name: "delete_customer",
  args: { customer_id: "c-42", reason: "GDPR erasure request" },
  prompt: "Delete customer c-42 and all their data?",
  wait_s: 60,
});
while (request.status === "pending") {
  console.log(`waiting for a person to decide ${request.id} ...`);
  request = await call("get_request", { id: request.id, wait_s: 60 });
}

if (request.status === "approved" || request.status === "modified") {
  const args = request.status === "modified" ? request.decision!.args! : request.args;
  console.log(deleteCustomer(args), `(approved by ${request.decision?.decided_by})`);
} else {
  console.log(`not run: ${request.status}: ${request.decision?.reason ?? "no reason given"}`);
}
await client.close();
