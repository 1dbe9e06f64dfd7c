"""Names and the modal of Slack's "Always…" button, shared by the notifier and the API.

The button (on approvals of a run) opens a modal offering the request's suggested rules and
approve-or-reject; its submission is a decision that remembers (`broker.judge.rule_decisions`).
Plain data only: nothing here imports slack_sdk.
"""

from __future__ import annotations

from typing import Any

from broker.domain.printable import one_line
from channels.wording import rule_text

ALWAYS = "always"  # action_id of the button
ALWAYS_CALLBACK = "always_rule"  # callback_id of the modal
RULE_BLOCK, RULE_ACTION = "rule", "rule_choice"
OUTCOME_BLOCK, OUTCOME_ACTION = "outcome", "outcome_choice"
REASON_BLOCK, REASON_ACTION = "always_reason", "always_reason_text"
MODE_BLOCK, MODE_ACTION = "mode", "mode_choice"
SHADOW = "shadow"  # the mode option's value: "try this rule" (it decides nothing yet)


def _option(text: str, value: str) -> dict[str, Any]:
    return {"text": {"type": "plain_text", "text": one_line(text)[:75]}, "value": value}


def always_modal(
    request_id: str, suggested: list[dict[str, Any]], channel_id: str | None = None
) -> dict[str, Any]:
    """The view `Always…` opens: which rule to keep, approve or reject, whether the rule decides
    from now on or is tried first in shadow, and why (for reject)."""
    rules = [_option(rule_text(r), str(i)) for i, r in enumerate(suggested)]
    outcomes = [_option("Approve always", "approved"), _option("Reject always", "rejected")]
    modes = [
        _option("Keep it: it decides from now on", "enforce"),
        _option("Try it first: it decides nothing, records what it would", SHADOW),
    ]
    return {
        "type": "modal",
        "callback_id": ALWAYS_CALLBACK,
        "private_metadata": f"{request_id} {channel_id}" if channel_id else request_id,
        "title": {"type": "plain_text", "text": "Always…"},
        "submit": {"type": "plain_text", "text": "Decide and keep"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "input",
                "block_id": RULE_BLOCK,
                "label": {"type": "plain_text", "text": "Decide the same way for"},
                "element": {
                    "type": "radio_buttons",
                    "action_id": RULE_ACTION,
                    "options": rules,
                    "initial_option": rules[0],
                },
            },
            {
                "type": "input",
                "block_id": OUTCOME_BLOCK,
                "label": {"type": "plain_text", "text": "Decision"},
                "element": {
                    "type": "radio_buttons",
                    "action_id": OUTCOME_ACTION,
                    "options": outcomes,
                    "initial_option": outcomes[0],
                },
            },
            {
                "type": "input",
                "block_id": MODE_BLOCK,
                "label": {"type": "plain_text", "text": "The rule"},
                "element": {
                    "type": "radio_buttons",
                    "action_id": MODE_ACTION,
                    "options": modes,
                    "initial_option": modes[0],
                },
            },
            {
                "type": "input",
                "block_id": REASON_BLOCK,
                "optional": True,
                "label": {"type": "plain_text", "text": "Why? (the agent is told, on reject)"},
                "element": {"type": "plain_text_input", "action_id": REASON_ACTION},
            },
        ],
    }


def chosen(state: dict[str, Any] | None, block: str, action: str) -> str | None:
    """The selected option's value (radio buttons) or typed value of one modal input."""
    values = (state or {}).get("values")
    inputs = values.get(block) if isinstance(values, dict) else None
    found = inputs.get(action) if isinstance(inputs, dict) else None
    if not isinstance(found, dict):
        return None
    option = found.get("selected_option")
    value = option.get("value") if isinstance(option, dict) else found.get("value")
    return value if isinstance(value, str) else None
