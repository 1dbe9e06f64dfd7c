"""What `approval-broker up --demo` starts: the demo agent registered for the fleet, its runs
and the demo's policy rule; and what `up` without `--demo` takes back (`withdraw_demo`), so the
demo's agent and rule never outlive the demo on a Redis that keeps them. The agent is named by
import path (`refunds_demo:agent`), so any worker can run it; this module never imports the
agent itself.
"""

from __future__ import annotations

from typing import Any

from broker.domain.errors import NotFound
from broker.domain.rules.models import parse_body
from broker.facade import Broker, RuleExists
from broker.runs.agents import agent_spec, register_agent, unregister_agent
from broker.runs.starting import start_run
from refunds_demo.shop import AGENT_NAME, QUEUE

AGENT_PATH = "refunds_demo:agent"
DEPS_PATH = "refunds_demo:make_deps"

DEMO_PROMPTS = (
    "Please refund $120 on order A103 because the tent arrived with a torn floor.",
    "Refund $75 on order A100 because the soles came off after a week.",
)


def register_demo(broker: Broker) -> None:
    """Register the demo agent for the fleet (by import path, so any worker can run it)."""
    if AGENT_NAME in broker.config.agents:
        return  # the config's [agents.refunds] wins
    register_agent(broker, AGENT_NAME, AGENT_PATH, deps=DEPS_PATH, queue=QUEUE)


def start_demo_runs(broker: Broker) -> list[str]:
    """Start two runs whose refunds are above the limit, so their approvals wait in the inbox."""
    return [start_run(broker, AGENT_NAME, prompt).id for prompt in DEMO_PROMPTS]


# A policy rule decides this run's refund: no person is asked (README, "Policy rules").
RULE_DEMO: dict[str, Any] = {
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
    """Keep the demo's policy rule (made once, by `demo`; a restart finds it in place).

    One that `withdraw_demo` revoked is made anew: a revoked rule never matches again, and the
    demo's run must still be decided by it."""
    rules = broker.requests.rules
    try:
        rules.create(parse_body(RULE_DEMO), created_by="demo")
    except RuleExists:
        existing = rules.get(RULE_DEMO["id"])
        if existing.revoked_at is None:
            return
        rules.discard(existing)  # its creation and revocation stay in the audit trail
        rules.create(parse_body(RULE_DEMO), created_by="demo")


def withdraw_demo(broker: Broker) -> list[str]:
    """Take back what an earlier `up --demo` left in Redis: the demo agent it registered and
    its rule (revoked, so the audit trail says so). A config's own `[agents.refunds]` stays.
    Returns what was withdrawn, for `up` to say."""
    gone: list[str] = []
    if AGENT_NAME not in broker.config.agents:
        try:
            spec = agent_spec(broker, AGENT_NAME)
        except NotFound:
            spec = None
        if spec is not None and spec.path == AGENT_PATH:  # the demo's, not one of the user's
            unregister_agent(broker, AGENT_NAME)
            gone.append(f"agent {AGENT_NAME}")
    try:
        rule = broker.requests.rules.get(RULE_DEMO["id"])
    except NotFound:
        rule = None
    if rule is not None and rule.revoked_at is None and rule.created_by == "demo":
        broker.requests.rules.revoke(rule.id, by="demo")
        gone.append(f"rule {rule.id}")
    return gone


def start_rule_demo_run(broker: Broker) -> str:
    """Start a run whose refund the demo rule approves at once: it never waits in the inbox."""
    add_demo_rule(broker)
    deps = {"customer": RULE_DEMO_CUSTOMER}
    return start_run(broker, AGENT_NAME, RULE_DEMO_PROMPT, deps=deps).id


# A split-payment order and a prompt that doesn't say card or store credit: the agent asks a
# person (a structured question), so the inbox shows the answer form (README, "Structured
# questions"). Its own customer, so a run started by hand for A105 still finds it unrefunded.
QUESTION_DEMO_PROMPT = "Refund order A105 because the headlamp flickers."
QUESTION_DEMO_CUSTOMER = "c-giftcard"


def start_question_demo_run(broker: Broker) -> str:
    """Start a run that asks "card or store credit?" for order A105 and waits for the answer."""
    deps = {"customer": QUESTION_DEMO_CUSTOMER}
    return start_run(broker, AGENT_NAME, QUESTION_DEMO_PROMPT, deps=deps).id


def start_demo(broker: Broker) -> list[str]:
    """Register the demo agent and start its two runs that wait for approval; returns their ids."""
    register_demo(broker)
    return start_demo_runs(broker)
