"""The demo's offline model: `script`, a FunctionModel that follows the prompt deterministically
(look the order up, ask card or store credit when it must, ask for the refund, report).

Set APPROVAL_BROKER_DEMO_MODEL (e.g. "openai:gpt-4o-mini") to use a real model instead. The
script reads only the message history; it never touches the shop or the broker.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

_ORDER = re.compile(r"\b([A-Za-z]\d{3})\b")
_AMOUNT = re.compile(r"\$\s*(\d+(?:\.\d{1,2})?)|(\d+(?:\.\d{1,2})?)\s*(?:usd|dollars)\b", re.I)
_REASON = re.compile(r"(?:because|reason:|since)\s+(.+)$", re.I | re.S)


@dataclass(frozen=True)
class Ask:
    """What the customer asked for, read from the prompt."""

    order_id: str | None
    amount: float | None
    reason: str

    @classmethod
    def parse(cls, text: str) -> Ask:
        order = _ORDER.search(text)
        amount = _AMOUNT.search(text)
        reason = _REASON.search(text)
        return cls(
            order.group(1).upper() if order else None,
            float(amount.group(1) or amount.group(2)) if amount else None,
            reason.group(1).strip().rstrip(".") if reason else "customer request",
        )


def _prompt(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def _tool_results(messages: list[ModelMessage]) -> dict[str, ToolReturnPart | RetryPromptPart]:
    """The latest result of each tool, by tool name."""
    out: dict[str, ToolReturnPart | RetryPromptPart] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart | RetryPromptPart) and part.tool_name:
                    out[part.tool_name] = part
    return out


def _text(part: ToolReturnPart | RetryPromptPart) -> str:
    return part.content if isinstance(part.content, str) else json.dumps(part.content, default=str)


def _ok(part: ToolReturnPart | RetryPromptPart) -> bool:
    return isinstance(part, ToolReturnPart) and part.outcome == "success"


_REFUND_TO = re.compile(r"store credit|\bcard\b", re.I)


def _asks_refund_to(lookup: ToolReturnPart | RetryPromptPart, prompt: str) -> bool:
    """A split payment, and the customer didn't say card or store credit."""
    paid_with = lookup.content.get("paid_with") if isinstance(lookup.content, dict) else None
    return bool(paid_with) and not _REFUND_TO.search(prompt)


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Follow the prompt: look the order up, ask for the refund, report what happened."""
    ask = Ask.parse(_prompt(messages))
    results = _tool_results(messages)
    output_tool = info.output_tools[0].name

    def final(refunded: bool, message: str, amount: float | None = None) -> ModelResponse:
        args = {"refunded": refunded, "order_id": ask.order_id, "amount": amount, "message": message}  # fmt: skip
        return ModelResponse(parts=[ToolCallPart(output_tool, args)])

    if ask.order_id is None:
        return final(False, "Which order is it? I need an order number such as A100.")
    lookup = results.get("lookup_order")
    if lookup is None:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": ask.order_id})])
    if not _ok(lookup):
        return final(False, f"I could not find that order: {_text(lookup)}")
    refund = results.get("issue_refund")
    refund_to = results.get("ask_refund_to")
    if refund is None and refund_to is None and _asks_refund_to(lookup, _prompt(messages)):
        return ModelResponse(parts=[ToolCallPart("ask_refund_to", {"order_id": ask.order_id})])
    if refund is None and refund_to is not None and not _ok(refund_to):
        return final(False, f"Nothing was refunded: {_text(refund_to)}")
    if refund is None:
        total = lookup.content.get("total") if isinstance(lookup.content, dict) else None
        amount = ask.amount if ask.amount is not None else total
        reason = ask.reason
        if refund_to is not None:  # "Refund order A105 to the card or as store credit? Card"
            reason += f"; refund to: {_text(refund_to).rpartition('? ')[2]}"
        args = {"order_id": ask.order_id, "amount": amount, "reason": reason}
        return ModelResponse(parts=[ToolCallPart("issue_refund", args)])
    if _ok(refund) and isinstance(refund.content, dict):
        return final(True, str(refund.content.get("message")), refund.content.get("amount"))
    if isinstance(refund, ToolReturnPart) and refund.outcome == "denied":
        return final(False, f"The refund was not approved: {_text(refund)}")
    return final(False, f"The refund was refused: {_text(refund)}")


def demo_model() -> Model | str:
    """A real model named by APPROVAL_BROKER_DEMO_MODEL, else the offline script."""
    return os.environ.get("APPROVAL_BROKER_DEMO_MODEL") or FunctionModel(
        script, model_name="refunds-script"
    )
