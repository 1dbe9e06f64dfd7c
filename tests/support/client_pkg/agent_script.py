"""Run inside a fresh venv that holds only the client wheel: a pydantic-ai agent whose refund
needs approval, through `BrokerApprovals`, waiting live. Prints the run's output as JSON."""

import json
import sys

from approval_broker_client import BrokerApprovals, RemoteBroker
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel


def script(messages, info):
    returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"done: {returned[0].content}")])
    return ModelResponse(parts=[ToolCallPart("refund", {"order_id": "A1", "amount": 120})])


url, token = sys.argv[1], sys.argv[2]
with RemoteBroker(url, token) as client:
    agent = Agent(
        FunctionModel(script),
        output_type=[str, DeferredToolRequests],
        capabilities=[BrokerApprovals(client, live_wait_s=60, agent="wheel-agent")],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(order_id: str, amount: float) -> str:
        return f"refunded {amount} on {order_id}"

    result = agent.run_sync("refund A1")
    print(json.dumps({"output": result.output}))
