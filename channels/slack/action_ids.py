"""Names shared by the Slack notifier (which builds messages) and the API (which reads clicks).

Both sides import these, so a renamed button can't silently break replies. Plain data only:
nothing here imports slack_sdk. Every button carries the request id as its `value`.
"""

from __future__ import annotations

from typing import Any

from broker.domain.printable import one_line

APPROVE = "approve"
REJECT = "reject"
ESCALATE = "escalate"
ACK = "ack"  # "I'm on it": holds escalation, decides nothing
ANSWER = "answer"
ANSWER_OPTION_PREFIX = "answer:"  # option buttons: action_id "answer:<option>"
ANSWER_TEXT = "answer_text"  # the text input of a question; its value is read on ANSWER
ANSWER_BLOCK = "answer_input"  # block_id of that input (state.values[ANSWER_BLOCK][ANSWER_TEXT])

REJECT_CALLBACK = "reject_reason"  # callback_id of the modal the Reject button opens
REJECT_REASON_BLOCK = "reason"  # its input block ...
REJECT_REASON_ACTION = "reason_text"  # ... and the input's action_id

MESSAGE_EVENT_TYPE = "approval_request"  # chat.postMessage metadata event_type


def actions_block_id(request_id: str) -> str:
    """block_id of a message's button row: names the request even without the button value."""
    return f"actions:{request_id}"


def option_action_id(option: str) -> str:
    return f"{ANSWER_OPTION_PREFIX}{option}"


def parse_action(action_id: str) -> tuple[str, str | None]:
    """('answer', 'yes') for 'answer:yes'; (action_id, None) for the other buttons."""
    if action_id.startswith(ANSWER_OPTION_PREFIX):
        return ANSWER, action_id[len(ANSWER_OPTION_PREFIX) :]
    return action_id, None


def reject_modal(request_id: str, tool_name: str, channel_id: str | None = None) -> dict[str, Any]:
    """The view the API opens (views.open) when Reject is clicked; submit carries the reason.

    Its private metadata names the request and the Slack channel the click came from (the
    submission says nothing of the channel, and a reply counts only from the request's queue).
    """
    return {
        "type": "modal",
        "callback_id": REJECT_CALLBACK,
        "private_metadata": f"{request_id} {channel_id}" if channel_id else request_id,
        "title": {"type": "plain_text", "text": "Reject"},
        "submit": {"type": "plain_text", "text": "Reject"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "input",
                "block_id": REJECT_REASON_BLOCK,
                "label": {"type": "plain_text", "text": f"Why reject {one_line(tool_name)[:100]}?"},
                "element": {
                    "type": "plain_text_input",
                    "action_id": REJECT_REASON_ACTION,
                    "multiline": True,
                },
            }
        ],
    }


def parse_modal_metadata(metadata: str) -> tuple[str, str | None]:
    """(request id, Slack channel id or None) from a reject modal's private metadata."""
    request_id, _, channel_id = metadata.partition(" ")
    return request_id, channel_id or None
