"""Slack's "Always…": the click opens the modal of suggested rules, its submission decides and
keeps the rule (through `broker.rule_decisions`, with the same who-may-decide checks).

`api/slack.py` verifies, parses and routes here; this module holds no Slack protocol of its own.
"""

from __future__ import annotations

import logging

from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from api.auth import approver_by_slack_user
from api.rules import remember
from api.slack import (
    SLACK_API_TIMEOUT_S,
    BlockActions,
    SlackReply,
    ViewSubmission,
    _failed,
    _replayed,
    channels_of,
    explain,
    notice,
)
from api.state import ApiState
from broker import slack_always as ids
from broker.auth import Principal
from broker.config import SlackConfig
from broker.decisions import Once
from broker.errors import BrokerError, Conflict
from broker.models import Decision, Outcome

log = logging.getLogger("api.slack")


def start_always(
    state: ApiState,
    slack: SlackConfig,
    payload: BlockActions,
    request_id: str,
    who: Principal,
    channel_id: str | None,
) -> SlackReply:
    """Open the modal, if the clicker may decide the request and it still waits."""
    request = state.broker.get_request(request_id)
    state.deciding.check_may_decide(who, request, channels_of(slack, channel_id))
    if not request.is_pending:
        raise Conflict(f"request {request.id} is already {request.status.value}", request=request)
    if not request.suggested_rules:
        return _failed(notice("This request offers no rule to keep.", "invalid_rule"))
    if not payload.trigger_id:
        return _failed(notice("Slack sent no trigger_id; can't open the dialog.", "invalid"))
    base_url = slack.api_base_url if slack.api_base_url.endswith("/") else slack.api_base_url + "/"
    client = WebClient(token=slack.bot_token, base_url=base_url, timeout=SLACK_API_TIMEOUT_S)
    try:
        client.views_open(
            trigger_id=payload.trigger_id,
            view=ids.always_modal(request.id, request.suggested_rules, channel_id),
        )
    except (SlackClientError, OSError) as exc:
        log.warning("views.open failed: %s", type(exc).__name__)
        return _failed(notice("Could not open the dialog; please try again.", "slack"))
    return SlackReply(body={"ok": True, "request_id": request.id, "status": "pending"})


def submit_always(
    state: ApiState, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    """The modal's submission: the decision and its rule, or the error shown in the modal."""
    view = payload.view
    request_id, _, channel_id = view.private_metadata.partition(" ")
    index = ids.chosen(view.state, ids.RULE_BLOCK, ids.RULE_ACTION) or "0"
    outcome = ids.chosen(view.state, ids.OUTCOME_BLOCK, ids.OUTCOME_ACTION) or "approved"
    reason = (ids.chosen(view.state, ids.REASON_BLOCK, ids.REASON_ACTION) or "").strip() or None
    try:
        who = approver_by_slack_user(state.config, payload.user.id)
        decision = Decision(
            outcome=Outcome.rejected if outcome == "rejected" else Outcome.approved,
            reason=reason[:10_000] if reason else None,
        )
        remember(
            state,
            request_id,
            decision,
            who,
            int(index) if index.isdigit() else -1,
            channel="slack",
            via=channels_of(slack, channel_id or None),
            once=once,
        )
    except BrokerError as exc:
        if isinstance(exc, Conflict) and exc.code == "replayed":
            raise _replayed() from None
        body = {"response_action": "errors", "errors": {ids.RULE_BLOCK: explain(exc)}}
        return SlackReply(body={**body, "error": exc.code}, decided=True)
    return SlackReply(body={"response_action": "clear"}, decided=True)
