"""The shapes of Slack's interaction payloads, and reading values out of them.

Only the fields the broker uses are modelled; anything else Slack sends is ignored. A payload
that is not the form field `payload` holding a JSON object, or one nested deeper or larger than
`broker.domain.bounded_json` allows, is a 400.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import parse_qs

from pydantic import BaseModel

from broker.domain import bounded_json
from broker.domain.errors import InvalidInput
from channels.errors import Refused


class SlackUser(BaseModel):
    id: str


class SlackChannelRef(BaseModel):
    id: str


class SlackAction(BaseModel):
    action_id: str
    value: str | None = None


class BlockActions(BaseModel):
    type: Literal["block_actions"]
    user: SlackUser
    actions: list[SlackAction]
    trigger_id: str | None = None
    response_url: str | None = None
    state: dict[str, Any] | None = None
    channel: SlackChannelRef | None = None  # where the clicked message is


class SlackView(BaseModel):
    callback_id: str | None = None
    private_metadata: str = ""
    state: dict[str, Any] | None = None


class ViewSubmission(BaseModel):
    type: Literal["view_submission"]
    user: SlackUser
    view: SlackView


def parse_payload(body: bytes) -> dict[str, Any]:
    """The JSON object in the form field `payload`; else 400."""
    try:
        fields = parse_qs(body.decode("utf-8"), strict_parsing=True)
        payload = bounded_json.loads(fields["payload"][0], "payload")
    except (bounded_json.TooDeep, bounded_json.TooLarge) as exc:
        raise Refused(400, "bad_request", exc.detail) from None
    except (ValueError, KeyError, IndexError, InvalidInput):
        raise Refused(400, "bad_request", "expected a form field 'payload' holding JSON") from None
    if not isinstance(payload, dict):
        raise Refused(400, "bad_request", "the payload must be a JSON object")
    return payload


def input_value(state: dict[str, Any] | None, action_id: str) -> str | None:
    """The value typed into the input with `action_id`, from a view's or message's state."""
    values = (state or {}).get("values")
    if not isinstance(values, dict):
        return None
    for block in values.values():
        if isinstance(block, dict) and isinstance(block.get(action_id), dict):
            value = block[action_id].get("value")
            return value if isinstance(value, str) else None
    return None
