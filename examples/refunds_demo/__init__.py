"""The demo `refunds` agent that `approval-broker up --demo` runs: an example, not the broker.

It lives outside `broker/` and `workers/` so that the fleet knows nothing of it: `up` without
`--demo` never imports it, registers no agent and adds no rule of its. Workers find it by import
path like any user's agent (`refunds_demo:agent`, deps `refunds_demo:make_deps`); the wheel ships
it as the top-level package `refunds_demo`, so an installed `up --demo` still has it.

* `agent`: the agent and its tools; `model`: its offline scripted model; `shop`: the orders, the
  ledger and the demo's own Redis keys; `runs`: what `up --demo` registers and starts.
"""

from __future__ import annotations

from refunds_demo.agent import RefundOutcome, agent, refunds_agent
from refunds_demo.model import Ask, demo_model, script
from refunds_demo.runs import (
    DEMO_PROMPTS,
    QUESTION_DEMO_CUSTOMER,
    QUESTION_DEMO_PROMPT,
    RULE_DEMO,
    RULE_DEMO_CUSTOMER,
    RULE_DEMO_PROMPT,
    add_demo_rule,
    register_demo,
    start_demo,
    start_demo_runs,
    start_question_demo_run,
    start_rule_demo_run,
    withdraw_demo,
)
from refunds_demo.shop import (
    AGENT_NAME,
    AUTO_REFUND_LIMIT,
    ORDERS,
    QUEUE,
    SPLIT_PAYMENT,
    TWO_PERSON_LIMIT,
    AlreadyRefunded,
    Ledger,
    Order,
    Refund,
    RefundDeps,
    make_deps,
)

__all__ = [
    "AGENT_NAME",
    "AUTO_REFUND_LIMIT",
    "DEMO_PROMPTS",
    "ORDERS",
    "QUESTION_DEMO_CUSTOMER",
    "QUESTION_DEMO_PROMPT",
    "QUEUE",
    "RULE_DEMO",
    "RULE_DEMO_CUSTOMER",
    "RULE_DEMO_PROMPT",
    "SPLIT_PAYMENT",
    "TWO_PERSON_LIMIT",
    "AlreadyRefunded",
    "Ask",
    "Ledger",
    "Order",
    "Refund",
    "RefundDeps",
    "RefundOutcome",
    "add_demo_rule",
    "agent",
    "demo_model",
    "make_deps",
    "refunds_agent",
    "register_demo",
    "script",
    "start_demo",
    "start_demo_runs",
    "start_question_demo_run",
    "start_rule_demo_run",
    "withdraw_demo",
]
