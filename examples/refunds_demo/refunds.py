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

This module is the agent and its tools; the orders and ledger are `refunds_demo/shop.py`, the
scripted model `refunds_demo/model.py`, what `up --demo` starts `refunds_demo/runs.py`. The
package re-exports every public name (`refunds_demo:agent`, `refunds_demo:make_deps`, ...).
"""

from __future__ import annotations

import time
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

from broker.ask import ask, question
from refunds_demo.model import demo_model
from refunds_demo.shop import (
    AGENT_NAME,
    AUTO_REFUND_LIMIT,
    QUEUE,
    SPLIT_PAYMENT,
    TWO_PERSON_LIMIT,
    AlreadyRefunded,
    Order,
    Refund,
    RefundDeps,
)


def _deps(ctx: RunContext[RefundDeps]) -> RefundDeps:
    if not isinstance(ctx.deps, RefundDeps):
        raise RuntimeError(
            "the refunds demo needs its deps factory: register it with deps='refunds_demo:make_deps'"
        )
    return ctx.deps


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


refunds_agent = agent  # the name the README's [agents.refunds] example uses
