"""The demo `refunds` agent that `approval-broker up --demo` runs: an example, not the broker.

It lives outside `broker/` and `workers/` so that the fleet knows nothing of it: `up` without
`--demo` never imports it, registers no agent and adds no rule of its. Workers find it by import
path like any user's agent (`refunds_demo:agent`, deps `refunds_demo:make_deps`); the wheel ships
it as the top-level package `refunds_demo`, so an installed `up --demo` still has it.

Every public name is importable from the package, loaded when first asked for (PEP 562): `up`
imports `refunds_demo.runs` to register or withdraw the demo without loading the agent, whose
model and tools take seconds to import on a busy machine.

* `refunds`: the agent and its tools; `model`: its offline scripted model; `shop`: the orders, the
  ledger and the demo's own Redis keys; `runs`: what `up --demo` registers and starts.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "AGENT_NAME": "shop",
    "AUTO_REFUND_LIMIT": "shop",
    "DEMO_PROMPTS": "runs",
    "ORDERS": "shop",
    "QUESTION_DEMO_CUSTOMER": "runs",
    "QUESTION_DEMO_PROMPT": "runs",
    "QUEUE": "shop",
    "RULE_DEMO": "runs",
    "RULE_DEMO_CUSTOMER": "runs",
    "RULE_DEMO_PROMPT": "runs",
    "SPLIT_PAYMENT": "shop",
    "TWO_PERSON_LIMIT": "shop",
    "AlreadyRefunded": "shop",
    "Ask": "model",
    "Ledger": "shop",
    "Order": "shop",
    "Refund": "shop",
    "RefundDeps": "shop",
    "RefundOutcome": "refunds",
    "add_demo_rule": "runs",
    "agent": "refunds",
    "demo_model": "model",
    "make_deps": "shop",
    "refunds_agent": "refunds",
    "register_demo": "runs",
    "script": "model",
    "start_demo": "runs",
    "start_demo_runs": "runs",
    "start_question_demo_run": "runs",
    "start_rule_demo_run": "runs",
    "withdraw_demo": "runs",
}
"""Where each public name lives: `refunds_demo.NAME` imports `refunds_demo.<module>`."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'refunds_demo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"refunds_demo.{home}"), name)


def __dir__() -> list[str]:
    return [*globals(), *_HOMES]
