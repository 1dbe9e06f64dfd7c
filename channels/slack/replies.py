"""What goes back to Slack: the handler's answer, the follow-up posted to the `response_url`,
and the modals opened with views.open.

A clicking user who may not decide gets HTTP 200 with an ephemeral-style JSON body, and the
same text is posted to the interaction's `response_url` after the answer: a non-200 would only
make Slack show a generic warning, never why. views.open is bound to the click's 3-second
trigger_id, so it has a short timeout. Nothing here decides.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import httpx
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from broker.domain.errors import Conflict
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import Principal
from broker.domain.printable import lines
from channels.inbound import InboundHost
from channels.slack.config import SlackConfig

log = logging.getLogger("approval_broker.api")

SLACK_API_TIMEOUT_S = 2  # views.open must land within the trigger_id's 3 seconds
RESPONSE_URL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SlackReply:
    """What the handler answers Slack with, and what (if anything) to post afterwards."""

    body: dict[str, Any]
    follow_up: dict[str, Any] | None = None
    decided: bool = False  # went through the decision step, which spends the signature itself


def notice(text: str, error: str | None = None) -> dict[str, Any]:
    """An ephemeral message body (also what is posted to the response_url). Its text may
    echo requester text (a refusal's detail): controls and bidi characters are dropped and
    mrkdwn's &, < and > escaped, as in every Slack message."""
    text = lines(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    body: dict[str, Any] = {"response_type": "ephemeral", "replace_original": False, "text": text}
    if error:
        body["error"] = error
    return body


def failed(body: dict[str, Any]) -> SlackReply:
    """A refusal: answered and posted to the response_url; the signature counts as spent."""
    return SlackReply(body=body, follow_up=body, decided=True)


def pending(request: BrokerRequest) -> SlackReply:
    """A modal opened: the request still waits."""
    return SlackReply(body={"ok": True, "request_id": request.id, "status": "pending"})


def post_notice(url: str, body: dict[str, Any]) -> None:
    """The follow-up, posted after the answer (a failure is logged, never raised)."""
    try:
        httpx.post(url, json=body, timeout=RESPONSE_URL_TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.warning("could not post to Slack's response_url: %s", type(exc).__name__)


def channels_of(slack: SlackConfig, channel_id: str | None) -> list[str]:
    """The configured channels (`slack:NAME`) that a Slack channel id stands for."""
    return [f"slack:{name}" for name, c in slack.channels.items() if c.channel == channel_id]


def pending_for(
    host: InboundHost,
    slack: SlackConfig,
    request_id: str,
    decider: Principal,
    channel_id: str | None,
) -> BrokerRequest:
    """The request a modal is about to be opened for, once `decider` may decide it from this
    channel and it still waits (else the BrokerError the click is refused with)."""
    request = host.broker.get_request(request_id)
    host.judge.check_may_decide(decider, request, channels_of(slack, channel_id))
    if not request.is_pending:
        raise Conflict(f"request {request.id} is already {request.status.value}", request=request)
    return request


def open_view(slack: SlackConfig, trigger_id: str, view: dict[str, Any]) -> None:
    base_url = slack.api_base_url if slack.api_base_url.endswith("/") else slack.api_base_url + "/"
    client = WebClient(token=slack.bot_token, base_url=base_url, timeout=SLACK_API_TIMEOUT_S)
    client.views_open(trigger_id=trigger_id, view=view)


def open_modal(
    slack: SlackConfig,
    trigger_id: str | None,
    request: BrokerRequest,
    view: dict[str, Any],
    what: str,
) -> SlackReply:
    """Open `view` (called `what` in the messages) for a click on `request`."""
    if not trigger_id:
        return failed(notice(f"Slack sent no trigger_id; can't open {what}.", "invalid"))
    try:
        open_view(slack, trigger_id, view)
    except (SlackClientError, OSError) as exc:
        log.warning("views.open failed: %s", type(exc).__name__)
        return failed(notice(f"Could not open {what}; please try again.", "slack"))
    return pending(request)
