"""An agent that asks for a refund, then says what its tool and its user said.

`executed` lists the refunds its tool made (a worker imports the agent by its path here).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

executed: list[Any] = []


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First a refund that needs approval; then say what the tool said and what the user said."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("refund", {"amount": 120}, tool_call_id="c1")])
    said = [p.content for p in last.parts if isinstance(p, UserPromptPart)]
    return ModelResponse(parts=[TextPart(f"tool: {returns[0].content} | user: {said}")])


chat_agent: Agent[None, Any] = Agent(FunctionModel(script), output_type=[str, DeferredToolRequests])


@chat_agent.tool_plain(requires_approval=True)
def refund(amount: float) -> str:
    executed.append(amount)
    return f"refunded {amount}"
