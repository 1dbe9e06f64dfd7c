"""The demo shop's data: its orders, its limits, and the ledger of refunds that really happened.

The ledger is a Redis hash per customer (so a forked worker and the test that checks it see the
same thing) and pays an order once: a job retried after its worker died may run the refund step
again (`attempts` counts each run), and the ledger still holds one refund. This module knows no
agent and no model (`refunds_demo/refunds.py` is the agent). Its Redis keys are its own
(`ledger_key`, `attempts_key`): the broker's key registry knows nothing of the demo.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from redis import Redis

from broker.runs.agents import DepsContext

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
        # no demo run touches it: the walkthrough's own run over HTTP refunds it
        Order("A106", "Sleeping bag", 95.00, "delivered"),
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


def ledger_key(prefix: str, customer: str | None = None) -> str:
    """Hash: a customer's ledger, order id -> refund JSON (no customer: the shop's own)."""
    return f"{prefix}demo:ledger" + (f":{customer}" if customer else "")


def attempts_key(prefix: str, customer: str | None = None) -> str:
    """Hash: one field `{tool call id}:{token}` per run of the refund step (a retried job shows)."""
    return f"{prefix}demo:attempts" + (f":{customer}" if customer else "")


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
        self.key = ledger_key(prefix, customer)
        self.attempts_key = attempts_key(prefix, customer)

    def record(self, refund: Refund) -> Refund:
        """Write a refund unless the order has one; a retried call gets its own refund back.

        Every call is counted first (`attempts`), so a refund step that ran twice shows. It is
        counted by a field of its own, not an increment: a client that sends the write again
        after Redis died before answering (it may have applied it) counts the call once.
        """
        self.redis.hset(self.attempts_key, f"{refund.tool_call_id}:{uuid.uuid4().hex}", 1)
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
        fields = (
            f.decode() if isinstance(f, bytes) else f for f in self.redis.hkeys(self.attempts_key)
        )
        return sum(f.rsplit(":", 1)[0] == tool_call_id for f in fields)


@dataclass
class RefundDeps:
    ledger: Ledger
    run_id: str
    orders: dict[str, Order] = field(default_factory=lambda: dict(ORDERS))
    limit: float = AUTO_REFUND_LIMIT


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
