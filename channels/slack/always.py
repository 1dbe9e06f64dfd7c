"""Slack's "Always…": the click opens the modal of suggested rules, its submission decides and
keeps the rule (through the judge, `broker.judge`, with the same who-may-decide checks).

`channels/slack/actions.py` and `channels/slack/modals.py` route here; this module holds no Slack
protocol of its own.
"""

from __future__ import annotations

from broker.domain.errors import BrokerError, Conflict
from broker.domain.models import Decision, Outcome
from broker.domain.principals import Principal, approver_with
from broker.facade import Once
from channels.inbound import InboundHost
from channels.refusals import refusal_text
from channels.slack import always_modal as ids
from channels.slack.config import SlackConfig
from channels.slack.payloads import BlockActions, ViewSubmission
from channels.slack.replies import (
    SlackReply,
    channels_of,
    failed,
    notice,
    open_modal,
    pending_for,
)
from channels.slack.signature import replayed


def start_always(
    host: InboundHost,
    slack: SlackConfig,
    payload: BlockActions,
    request_id: str,
    decider: Principal,
    channel_id: str | None,
) -> SlackReply:
    """Open the modal, if the clicker may decide the request and it still waits."""
    request = pending_for(host, slack, request_id, decider, channel_id)
    if not request.suggested_rules:
        return failed(notice("This request offers no rule to keep.", "invalid_rule"))
    view = ids.always_modal(request.id, request.suggested_rules, channel_id)
    return open_modal(slack, payload.trigger_id, request, view, "the dialog")


def submit_always(
    host: InboundHost, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    """The modal's submission: the decision and its rule, or the error shown in the modal."""
    view = payload.view
    request_id, _, channel_id = view.private_metadata.partition(" ")
    index = ids.chosen(view.state, ids.RULE_BLOCK, ids.RULE_ACTION) or "0"
    outcome = ids.chosen(view.state, ids.OUTCOME_BLOCK, ids.OUTCOME_ACTION) or "approved"
    reason = (ids.chosen(view.state, ids.REASON_BLOCK, ids.REASON_ACTION) or "").strip() or None
    shadow = ids.chosen(view.state, ids.MODE_BLOCK, ids.MODE_ACTION) == ids.SHADOW
    try:
        decider = approver_with(
            host.config, "slack_user_id", payload.user.id, who=f"Slack user {payload.user.id}"
        )
        decision = Decision(
            outcome=Outcome.rejected if outcome == "rejected" else Outcome.approved,
            reason=reason[:10_000] if reason else None,
        )
        suggested = int(index) if index.isascii() and index.isdigit() and len(index) < 4 else -1
        host.judge.decide(
            request_id,
            decision,
            decider,
            via=channels_of(slack, channel_id or None),
            once=once,
            remember={"suggested": suggested, "mode": "shadow"} if shadow else suggested,
        )
    except BrokerError as exc:
        if isinstance(exc, Conflict) and exc.code == "replayed":
            raise replayed() from None
        body = {"response_action": "errors", "errors": {ids.RULE_BLOCK: refusal_text(exc)}}
        return SlackReply(body={**body, "error": exc.code}, decided=True)
    return SlackReply(body={"response_action": "clear"}, decided=True)
