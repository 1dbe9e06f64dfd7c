"""Remote agents for tests: one with a gated tool, and a person who decides when it asks."""

from __future__ import annotations

import threading
from typing import Any

from approval_broker_client import BrokerApprovals, RemoteBroker
from pydantic_ai import Agent, CallDeferred, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.support.waiting import wait_for


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask for the tools the prompt names; once they returned, say what came back."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    results = [p for p in last.parts if isinstance(p, ToolReturnPart | RetryPromptPart)]
    if results:
        said = "; ".join(f"{p.tool_name}: {p.content}" for p in results)
        return ModelResponse(parts=[TextPart(said)])
    prompt = str(last.parts[-1].content)
    calls = [
        ToolCallPart("refund", {"order_id": "A103", "amount": 120}, tool_call_id="call-refund")
    ]
    if "ask" in prompt:
        calls.append(ToolCallPart("ask_customer", {"question": "Photos?"}, tool_call_id="call-ask"))
    return ModelResponse(parts=calls)


def make_agent(capability: BrokerApprovals, executed: list[Any]) -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(
        FunctionModel(script),
        output_type=[str, DeferredToolRequests],
        capabilities=[capability],
    )

    @agent.tool_plain(requires_approval=True)
    def refund(order_id: str, amount: float) -> str:
        executed.append((order_id, amount))
        return f"refunded {amount} on {order_id}"

    @agent.tool_plain
    def ask_customer(question: str) -> str:
        raise CallDeferred({"prompt": f"Ask the customer: {question}"}, kind="question")

    return agent


def decide_when_asked(client: RemoteBroker, decide: Any, n: int = 1) -> threading.Thread:
    """A person on another thread: waits for `n` pending requests, then decides each."""

    def person() -> None:
        pending = wait_for(
            lambda: len(found := client.list_requests(status="pending")) >= n and found
        )
        for request in pending:
            decide(request)

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    return thread
