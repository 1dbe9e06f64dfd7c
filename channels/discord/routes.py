"""Discord interactions (`POST /v1/discord/interactions`, the application's Interactions
Endpoint URL): the route, which verifies, parses and answers within Discord's 3 seconds.

- Verified with Ed25519 (`cryptography`, which the receipts already need: no extra): `X-Signature-Ed25519` over `X-Signature-Timestamp` + the raw
  body, with `[discord] public_key`; a timestamp more than 5 minutes off is refused as stale.
  Anything else is 401 and nothing is read.
- PING (type 1) is answered with PONG (type 1).
- A button click (type 3) goes to `channels.cards.clicks` (one Lua call inline), and is answered
  with a deferred update of the message (type 6): the notifier edits the card from the event.
  A refusal, "too late" (naming who decided) or "I'm on it" is an ephemeral message (type 4,
  flag 64) to the clicker only. Reject opens a modal (type 9) asking the reason; its
  submission (type 5) completes the rejection.
- Each interaction is handled once: its id's marker is spent with the decision it carries.
"""

from __future__ import annotations

import re
import time
from typing import Any

from approval_broker_client.models import ErrorBody
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from broker.domain import bounded_json
from broker.domain.errors import InvalidInput
from broker.domain.printable import one_line
from broker.facade import Once
from broker.judge.deciding import REPLAY_TTL_S
from channels.cards import button_tokens as ids
from channels.cards import clicks
from channels.cards.clicks import ClickResult, Result
from channels.discord.config import DiscordConfig, discord_section
from channels.errors import Refused
from channels.inbound import Host, InboundHost
from channels.wording import rule_text

router = APIRouter(prefix="/v1/discord", tags=["discord"])

PING, COMPONENT, MODAL_SUBMIT = 1, 3, 5
PONG, MESSAGE, DEFERRED_UPDATE, MODAL = 1, 4, 6, 9
EPHEMERAL = 64
MAX_SKEW_S = 300
TIMESTAMP = re.compile(r"[0-9]{1,12}", re.ASCII)
"""Seconds since the epoch in ASCII digits, bounded before it is read as a number."""
SIGNATURE = re.compile(r"[0-9a-fA-F]{128}", re.ASCII)  # an Ed25519 signature: 64 bytes
MAX_MODAL_ITEMS = 25  # Discord's modals hold 5 rows of 5
REASON_INPUT = "reason"


def verify(
    discord: DiscordConfig, body: bytes, signature: str | None, timestamp: str | None
) -> None:
    """401 unless the body is signed by Discord's key for this application, and recent."""
    if not signature or not timestamp:
        raise Refused(401, "bad_signature", "the Discord signature headers are missing")
    if not TIMESTAMP.fullmatch(timestamp) or not SIGNATURE.fullmatch(signature):
        raise Refused(401, "bad_signature", "the Discord signature headers are malformed")
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(discord.public_key)).verify(
            bytes.fromhex(signature), timestamp.encode() + body
        )
    except (ValueError, InvalidSignature):
        raise Refused(401, "bad_signature", "the Discord signature is wrong") from None
    if abs(int(time.time()) - int(timestamp)) > MAX_SKEW_S:
        raise Refused(401, "stale", "the Discord signature timestamp is too old or in the future")


def channels_of(discord: DiscordConfig, channel_id: str | None) -> list[str]:
    """The configured channels (`discord:NAME`) that a Discord channel id stands for."""
    return [f"discord:{n}" for n, c in discord.channels.items() if c.channel_id == channel_id]


def ephemeral(text: str) -> dict[str, Any]:
    """A message only the clicker sees."""
    return {
        "type": MESSAGE,
        "data": {
            "content": one_line(text)[:1900],
            "flags": EPHEMERAL,
            "allowed_mentions": {"parse": []},
        },
    }


def reason_modal(result: ClickResult) -> dict[str, Any]:
    request = result.request
    assert request is not None
    return {
        "type": MODAL,
        "data": {
            "custom_id": ids.token(ids.REJECT, request.id),
            "title": "Reject",
            "components": [
                {
                    "type": 1,
                    "components": [
                        {
                            "type": 4,
                            "custom_id": REASON_INPUT,
                            "style": 2,
                            "label": f"Why reject {one_line(request.tool_name)}?"[:45],
                            "required": False,
                            "max_length": 4000,
                        }
                    ],
                }
            ],
        },
    }


def rule_buttons(result: ClickResult) -> dict[str, Any]:
    """Always…: an ephemeral message with one "Approve always" button per suggested rule."""
    request = result.request
    assert request is not None
    rows = [
        {
            "type": 1,
            "components": [
                {
                    "type": 2,
                    "style": 1,
                    "label": one_line("Approve always: " + rule_text(rule))[:80],
                    "custom_id": ids.token(ids.ALWAYS_RULE, request.id, i),
                }
            ],
        }
        for i, rule in enumerate(request.suggested_rules[:5])
    ]
    body = ephemeral("Approve, and decide the same way later for:")
    body["data"]["components"] = rows
    return body


def user_of(payload: dict[str, Any]) -> str:
    """The clicker: `member.user` in a server, `user` in a DM."""
    member = payload.get("member")
    user = member.get("user") if isinstance(member, dict) else payload.get("user")
    uid = user.get("id") if isinstance(user, dict) else None
    if not isinstance(uid, str):
        raise Refused(400, "bad_request", "the interaction names no user")
    return uid


def reason_of(data: dict[str, Any]) -> str:
    """The text typed into the modal's reason input (rows of inputs, each row an object with a
    list of input objects); 400 for a submission of any other shape."""
    rows = data.get("components", [])
    if not isinstance(rows, list) or len(rows) > MAX_MODAL_ITEMS:
        raise malformed_modal()
    for row in rows:
        items = row.get("components", []) if isinstance(row, dict) else None
        if not isinstance(items, list) or len(items) > MAX_MODAL_ITEMS:
            raise malformed_modal()
        for item in items:
            if not isinstance(item, dict):
                raise malformed_modal()
            if item.get("custom_id") == REASON_INPUT:
                value = item.get("value", "")
                if not isinstance(value, str):
                    raise malformed_modal()
                return value
    return ""


def malformed_modal() -> Refused:
    return Refused(400, "bad_request", "the modal submission's components are malformed")


def respond(result: ClickResult) -> dict[str, Any]:
    if result.result is Result.decided:
        return {"type": DEFERRED_UPDATE}
    if result.result is Result.ask_reason:
        return reason_modal(result)
    if result.result is Result.always:
        return rule_buttons(result)
    return ephemeral(result.text)


def handle(
    host: InboundHost, discord: DiscordConfig, payload: dict[str, Any], once: Once
) -> dict[str, Any]:
    kind = payload.get("type")
    data = payload.get("data")
    if kind not in (COMPONENT, MODAL_SUBMIT) or not isinstance(data, dict):
        return ephemeral("Nothing to do.")
    token = data.get("custom_id")
    channel_id = payload.get("channel_id")
    via = channels_of(discord, channel_id if isinstance(channel_id, str) else None)
    user = user_of(payload)
    if not isinstance(token, str):
        raise Refused(400, "bad_request", "the interaction has no custom_id")
    if kind == MODAL_SUBMIT:
        parsed = ids.parse(token)
        if parsed is None or parsed[0] != ids.REJECT:
            return ephemeral("This form names no request.")
        result = clicks.reject(host, "discord", parsed[2], reason_of(data), user, via, once)
        return respond(result)
    return respond(clicks.click(host, "discord", token, user, via, once))


@router.post(
    "/interactions",
    response_model=None,
    responses={
        200: {"description": "an interaction response (PONG, deferred update, modal, message)"},
        400: {"model": ErrorBody},
        401: {"model": ErrorBody, "description": "missing, wrong or stale signature"},
        409: {"model": ErrorBody, "description": "this interaction was already handled"},
    },
)
async def discord_interactions(request: Request, host: Host) -> JSONResponse:
    """Discord interactions: PING, button clicks and the reject-reason modal."""
    discord = discord_section(host.config)
    if discord is None:
        raise Refused(404, "not_configured", "Discord is not configured")
    body = await request.body()
    verify(
        discord,
        body,
        request.headers.get("x-signature-ed25519"),
        request.headers.get("x-signature-timestamp"),
    )
    try:
        payload = bounded_json.loads(body, "interaction")
    except (bounded_json.TooDeep, bounded_json.TooLarge) as exc:
        raise Refused(400, "bad_request", exc.detail) from None
    except InvalidInput:
        raise Refused(400, "bad_request", "the body must be a Discord interaction (JSON)") from None
    if not isinstance(payload, dict):
        raise Refused(400, "bad_request", "the body must be a JSON object")
    if payload.get("type") == PING:
        return JSONResponse({"type": PONG})
    interaction = payload.get("id")
    if not isinstance(interaction, str) or not interaction:
        raise Refused(400, "bad_request", "the interaction has no id")
    once = host.broker.once.marker("discord", interaction[:64], REPLAY_TTL_S)
    if await run_in_threadpool(host.broker.once.spent, once):
        raise Refused(409, "replayed", "this Discord interaction was already received")
    answer = await run_in_threadpool(handle, host, discord, payload, once)
    await run_in_threadpool(host.broker.once.spend, once)
    return JSONResponse(answer)
