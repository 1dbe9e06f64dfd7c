"""The demo `refunds` agent: small refunds happen on their own, large ones wait for a person.

* A few orders, a `lookup_order` tool and an `issue_refund` tool.
* `issue_refund` checks the request first: an unknown order, one not delivered yet, an amount
  over the order total or an order already refunded is refused on the spot, and nobody is asked.
* Up to `AUTO_REFUND_LIMIT` it refunds by itself; above it, it raises `ApprovalRequired` and the
  run waits for a decision in the inbox (handler queue `default`). Above `TWO_PERSON_LIMIT`
  the tool's metadata asks for `quorum = 2`: two different people must approve.
* The ledger (in Redis, so a forked worker and the test that checks it see the same thing) is
  the truth: the output says whether a refund really happened, and an output validator sends a
  claim that doesn't match the ledger back to the model. It also counts how often the refund
  step ran for each tool call: a job retried after its worker died may run it again, and the
  ledger still pays once.
* Each customer has their own orders and ledger: `start_run(..., deps={"customer": "c-17"})`
  refunds that customer's order A103, not another customer's (no customer: the shop's own
  demo ledger). So many runs can each refund an order of their own, as a load test needs.

Offline it runs on `script`, a FunctionModel that follows the prompt deterministically; set
APPROVAL_BROKER_DEMO_MODEL (e.g. "openai:gpt-4o-mini") to use a real model instead.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    DeferredToolRequests,
    ModelRetry,
    RunContext,
    ToolFailed,
)
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
from redis import Redis

from broker.agents import DepsContext, register_agent
from broker.ask import ask, question
from broker.client import Broker
from broker.keys import Keys
from broker.rules import RuleExists, parse_body
from broker.runs import start_run

AGENT_NAME = "refunds"
QUEUE = "default"
AUTO_REFUND_LIMIT = 50.0
TWO_PERSON_LIMIT = 150.0  # above this a refund needs two approvers (the request's quorum)


@dataclass(frozen=True)
class Order:
    id: str
    item: str
    total: float
    status: str  # "delivered" | "shipped" | "cancelled"


ORDERS: dict[str, Order] = {
    o.id: o
    for o in [
        Order("A100", "Trail running shoes", 84.50, "delivered"),
        Order("A101", "Wool socks, three pairs", 18.00, "delivered"),
        Order("A102", "Rain jacket", 129.00, "shipped"),
        Order("A103", "Two-person tent", 240.00, "delivered"),
        Order("A104", "Camping stove", 65.00, "cancelled"),
        Order("A105", "Headlamp", 45.00, "delivered"),
    ]
}
# Paid partly with a gift card: the money can go back to the card or as store credit, and the
# agent asks a person which (a structured question) when the customer didn't say.
SPLIT_PAYMENT = frozenset({"A105"})


class AlreadyRefunded(Exception):
    pass


@dataclass(frozen=True)
class Refund:
    order_id: str
    amount: float
    reason: str
    run_id: str
    tool_call_id: str
    at: float


_CUSTOMER = re.compile(r"[A-Za-z0-9][\w.-]{0,99}")


class Ledger:
    """What really happened: one refund per order, written once (a Redis hash per customer)."""

    def __init__(self, redis: Redis, prefix: str, customer: str | None = None) -> None:
        if customer is not None and not _CUSTOMER.fullmatch(customer):
            raise ValueError(
                f"customer {customer!r} must be 1-100 letters, digits, '_', '-' or '.'"
            )
        self.redis = redis
        self.customer = customer
        keys = Keys(prefix)
        self.key = keys.demo_ledger(customer)
        self.attempts_key = keys.demo_attempts(customer)

    def record(self, refund: Refund) -> Refund:
        """Write a refund unless the order has one; a retried call gets its own refund back.

        Every call is counted first (`attempts`), so a refund step that ran twice shows.
        """
        self.redis.hincrby(self.attempts_key, refund.tool_call_id, 1)
        if self.redis.hsetnx(self.key, refund.order_id, json.dumps(refund.__dict__)):
            return refund
        existing = self.get(refund.order_id)
        if existing is not None and existing.tool_call_id == refund.tool_call_id:
            return existing
        raise AlreadyRefunded(refund.order_id)

    def get(self, order_id: str) -> Refund | None:
        raw = self.redis.hget(self.key, order_id)
        return Refund(**json.loads(raw)) if raw else None

    def all(self) -> list[Refund]:
        return [Refund(**json.loads(v)) for v in self.redis.hgetall(self.key).values()]

    def for_run(self, run_id: str) -> list[Refund]:
        return [r for r in self.all() if r.run_id == run_id]

    def attempts(self, tool_call_id: str) -> int:
        """How many times the refund step ran for this tool call (0: never)."""
        return int(self.redis.hget(self.attempts_key, tool_call_id) or 0)


@dataclass
class RefundDeps:
    ledger: Ledger
    run_id: str
    orders: dict[str, Order] = field(default_factory=lambda: dict(ORDERS))
    limit: float = AUTO_REFUND_LIMIT


def _deps(ctx: RunContext[RefundDeps]) -> RefundDeps:
    if not isinstance(ctx.deps, RefundDeps):
        raise RuntimeError(
            "the refunds demo needs its deps factory: register it with deps='workers.demo:make_deps'"
        )
    return ctx.deps


def make_deps(ctx: DepsContext) -> RefundDeps:
    """The deps factory the registry calls for every run and resume.

    `start_run(..., deps=...)` may give `{"customer": "c-17", "limit": 80}`: whose orders and
    ledger the run works on, and the auto-refund limit. A bad value fails the run, saying why.
    """
    data = ctx.data if isinstance(ctx.data, dict) else {}
    limit = AUTO_REFUND_LIMIT
    if isinstance(data.get("limit"), int | float) and not isinstance(data["limit"], bool):
        limit = float(data["limit"])
    customer = data.get("customer")
    if customer is not None and not isinstance(customer, str):
        raise ValueError(f"deps.customer must be a string, not {type(customer).__name__}")
    ledger = Ledger(ctx.broker.redis, ctx.broker.keys.prefix, customer)
    return RefundDeps(ledger, ctx.run_id, limit=limit)


class RefundOutcome(BaseModel):
    """The run's answer; `refunded` is checked against the ledger before it is accepted."""

    refunded: bool
    order_id: str | None = None
    amount: float | None = None
    message: str


INSTRUCTIONS = f"""\
You handle refund requests for an outdoor gear shop.
Look the order up first with lookup_order, then call issue_refund once with the order id, the
amount the customer asks for (the order total if they name none) and their reason in a few words.
Refunds up to ${AUTO_REFUND_LIMIT:.0f} happen at once; larger ones wait for a person's approval.
If a refund is refused or denied, say why, using the reason you were given.
Set refunded to true only if issue_refund reported that money was refunded.
If lookup_order says the order was paid with a gift card and the customer did not say whether
to refund to the card or as store credit, call ask_refund_to first and add the answer to the
reason."""


# ---- the scripted model --------------------------------------------------------------------

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


# ---- the agent -----------------------------------------------------------------------------

agent: Agent[RefundDeps, RefundOutcome | DeferredToolRequests] = Agent(
    demo_model(),
    name=AGENT_NAME,
    deps_type=RefundDeps,
    output_type=[RefundOutcome, DeferredToolRequests],
    instructions=INSTRUCTIONS,
)


@agent.tool
def lookup_order(ctx: RunContext[RefundDeps], order_id: str) -> dict[str, Any]:
    """Look an order up: its item, total and status."""
    deps = _deps(ctx)
    order = deps.orders.get(order_id.strip().upper())
    if order is None:
        raise ToolFailed(f"There is no order {order_id!r}.")
    refund = deps.ledger.get(order.id)
    return {
        "id": order.id,
        "item": order.item,
        "total": order.total,
        "status": order.status,
        "refunded": refund.amount if refund else None,
        **({"paid_with": "gift card and card"} if order.id in SPLIT_PAYMENT else {}),
    }


def check_refund(deps: RefundDeps, order_id: str, amount: float) -> Order:
    """Refuse what can't happen, before anyone is asked."""
    order = deps.orders.get(order_id.strip().upper())
    if order is None:
        raise ToolFailed(f"There is no order {order_id!r}, so nothing was refunded.")
    if order.status != "delivered":
        raise ToolFailed(f"Order {order.id} is {order.status}, not delivered; it can't be refunded.")  # fmt: skip
    if deps.ledger.get(order.id) is not None:
        raise ToolFailed(f"Order {order.id} has already been refunded.")
    if amount <= 0:
        raise ToolFailed("A refund must be more than $0.")
    if amount > order.total:
        raise ToolFailed(
            f"${amount:.2f} is more than the order total of ${order.total:.2f}; nothing was refunded."
        )
    return order


@agent.tool
def issue_refund(
    ctx: RunContext[RefundDeps], order_id: str, amount: float, reason: str
) -> dict[str, Any]:
    """Refund part or all of a delivered order; above the limit a person must approve first."""
    deps = _deps(ctx)
    order = check_refund(deps, order_id, amount)
    if amount > deps.limit and not ctx.tool_call_approved:
        customer = deps.ledger.customer
        raise ApprovalRequired(
            metadata={
                "prompt": (
                    f"Refund ${amount:.2f} on order {order.id} ({order.item}, total "
                    f"${order.total:.2f})"
                    + (f" of customer {customer}" if customer else "")
                    + f"? The customer says: {reason}"
                ),
                "order": {"id": order.id, "item": order.item, "total": order.total},
                "customer": customer,
                "auto_refund_limit": deps.limit,
                "quorum": 2 if amount > TWO_PERSON_LIMIT else 1,
            }
        )
    try:
        done = deps.ledger.record(
            Refund(order.id, amount, reason, deps.run_id, ctx.tool_call_id, time.time())
        )
    except AlreadyRefunded:
        raise ToolFailed(f"Order {order.id} has already been refunded.") from None
    return {
        "refunded": True,
        "order_id": done.order_id,
        "amount": done.amount,
        "message": f"Refunded ${done.amount:.2f} on order {done.order_id}.",
    }


@agent.tool
def ask_refund_to(ctx: RunContext[RefundDeps], order_id: str) -> str:
    """Ask a person whether a split-payment order is refunded to the card or as store credit."""
    _deps(ctx)
    order_id = order_id.strip().upper()
    ask(
        [
            question(
                f"Refund order {order_id} to the card or as store credit?",
                "Refund to",
                [
                    {"label": "Card", "description": "back to the card it was paid with"},
                    {"label": "Store credit", "description": "a gift card, usable at once"},
                ],
                context="It was paid partly with a gift card, and the customer didn't say.",
            )
        ],
        prompt=f"How should order {order_id} be refunded?",
        queue=QUEUE,
    )


@agent.output_validator
def matches_the_ledger(
    ctx: RunContext[RefundDeps], output: RefundOutcome | DeferredToolRequests
) -> RefundOutcome | DeferredToolRequests:
    """The model may only say a refund happened if the ledger shows one for this run."""
    if isinstance(output, RefundOutcome):
        deps = _deps(ctx)
        done = deps.ledger.for_run(deps.run_id)
        if output.refunded != bool(done):
            raise ModelRetry(
                f"You said refunded={output.refunded}, but the ledger shows "
                f"{'a refund' if done else 'no refund'} for this request. Say what really happened."
            )
    return output


# ---- `approval-broker up --demo` -------------------------------------------------------------

refunds_agent = agent  # the name the README's [agents.refunds] example uses

DEMO_PROMPTS = (
    "Please refund $120 on order A103 because the tent arrived with a torn floor.",
    "Refund $75 on order A100 because the soles came off after a week.",
)


def register_demo(broker: Broker) -> None:
    """Register the demo agent for the fleet (by import path, so any worker can run it)."""
    if AGENT_NAME in broker.config.agents:
        return  # the config's [agents.refunds] wins
    register_agent(
        broker, AGENT_NAME, f"{__name__}:agent", deps=f"{__name__}:make_deps", queue=QUEUE
    )


def start_demo_runs(broker: Broker) -> list[str]:
    """Start two runs whose refunds are above the limit, so their approvals wait in the inbox."""
    return [start_run(broker, AGENT_NAME, prompt).id for prompt in DEMO_PROMPTS]


# A policy rule decides this run's refund: no person is asked (README, "Policy rules").
RULE_DEMO = {
    "id": "demo-routine-refunds",
    "effect": "allow",
    "tool": "issue_refund",
    "agent": AGENT_NAME,
    "args": {"amount": {"le": 60}},
    "reason": "Refunds up to $60 are routine at the demo desk.",
}
RULE_DEMO_PROMPT = "Refund $60 on order A100 because the laces snapped."
RULE_DEMO_CUSTOMER = "c-regular"


def add_demo_rule(broker: Broker) -> None:
    """Keep the demo's policy rule (made once, by `demo`; a restart finds it in place)."""
    try:
        broker.requests.rules.create(parse_body(RULE_DEMO), created_by="demo")
    except RuleExists:
        pass


def start_rule_demo_run(broker: Broker) -> str:
    """Start a run whose refund the demo rule approves at once: it never waits in the inbox."""
    add_demo_rule(broker)
    deps = {"customer": RULE_DEMO_CUSTOMER}
    return start_run(broker, AGENT_NAME, RULE_DEMO_PROMPT, deps=deps).id


def start_demo(broker: Broker) -> list[str]:
    """Register the demo agent and start its two runs; returns their ids."""
    register_demo(broker)
    return start_demo_runs(broker)
