"""Slack interactivity (`POST /v1/slack/interactions`): the route, which verifies, parses and
hands the interaction to the module of its kind.

The modules, one job each: `channels/slack/signature.py` (the v0 signature and its replay marker),
`channels/slack/payloads.py` (the payload shapes), `channels/slack/actions.py` (button clicks),
`channels/slack/modals.py` (the reject-reason modal and the answer form), `channels/slack/always.py`
(the "Always…" modal of rules) and `channels/slack/replies.py` (what goes back to Slack).

A signature is accepted once (an exact replay is refused): a click's signature is spent in the
same atomic step as the decision it carries, so a click whose decision failed (Redis gone for a
moment) can be sent again and still count. Slack wants an answer within 3 seconds: the decision
is one Lua call made inline. Updating the message after a decision is the notifier's job (it
sees the event).
"""

from __future__ import annotations

from typing import Any

from approval_broker_client.models import ErrorBody
from fastapi import APIRouter, BackgroundTasks, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from broker.facade import Once
from channels.errors import Refused
from channels.inbound import Host, InboundHost
from channels.slack.actions import handle_block_actions
from channels.slack.config import SlackConfig, slack_section
from channels.slack.modals import handle_view_submission
from channels.slack.payloads import BlockActions, ViewSubmission, parse_payload
from channels.slack.replies import SlackReply, post_notice
from channels.slack.response_urls import response_url_allowed
from channels.slack.signature import replayed, signature_once, verify

router = APIRouter(prefix="/v1/slack", tags=["slack"])


def handle(
    host: InboundHost, slack: SlackConfig, payload: dict[str, Any], once: Once
) -> SlackReply:
    """What to answer; a deciding interaction spends `once` with its decision."""
    kind = payload.get("type")
    try:
        if kind == "block_actions":
            return handle_block_actions(host, slack, BlockActions.model_validate(payload), once)
        if kind == "view_submission":
            submission = ViewSubmission.model_validate(payload)
            return handle_view_submission(host, slack, submission, once)
    except ValidationError:
        raise Refused(400, "bad_request", f"malformed Slack {kind} payload") from None
    return SlackReply(body={})  # shortcuts, view_closed...: nothing to do


@router.post(
    "/interactions",
    response_model=None,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/x-www-form-urlencoded": {
                    "schema": {
                        "type": "object",
                        "properties": {"payload": {"type": "string"}},
                        "required": ["payload"],
                    }
                }
            },
        }
    },
    responses={
        200: {"description": "handled (errors for the user come as an ephemeral message body)"},
        400: {"model": ErrorBody},
        409: {"model": ErrorBody, "description": "a replayed signature"},
    },
)
async def slack_interactions(
    request: Request, background: BackgroundTasks, host: Host
) -> JSONResponse:
    """Slack block actions (approve, reject, escalate, answer) and the reject-reason modal."""
    slack = slack_section(host.config)
    if slack is None:
        raise Refused(404, "not_configured", "Slack is not configured")
    body = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    signature = verify(slack, body, headers)
    payload = parse_payload(body)
    once = signature_once(host, signature)
    if await run_in_threadpool(host.broker.once.spent, once):
        raise replayed()
    outcome = await run_in_threadpool(handle, host, slack, payload, once)
    if not outcome.decided:  # opening the reason dialog and the like: spend it here
        await run_in_threadpool(host.broker.once.spend, once)
    url = payload.get("response_url")
    if outcome.follow_up and isinstance(url, str) and response_url_allowed(url, slack.api_base_url):
        background.add_task(post_notice, url, outcome.follow_up)
    return JSONResponse(outcome.body)
