"""Slack's "Always…": the click opens the modal of suggested rules, its submission decides and
keeps the rule (through `broker.judge.rule_decisions`, with the same who-may-decide checks).

`api/slack_actions.py` and `api/slack_modals.py` route here; this module holds no Slack
protocol of its own.
"""

from __future__ import annotations

from api.auth import approver_by_slack_user
from api.refusals import refusal_text
from api.rules import remember
from api.slack_payloads import BlockActions, ViewSubmission
from api.slack_replies import (
    SlackReply,
    channels_of,
    failed,
    notice,
    open_modal,
    pending_for,
)
from api.slack_signature import replayed
from api.state import ApiState
from broker.channels.slack import always_modal as ids
from broker.domain.config import SlackConfig
from broker.domain.errors import BrokerError, Conflict
from broker.domain.models import Decision, Outcome
from broker.domain.principals import Principal
from broker.store.decisions import Once


def start_always(
    state: ApiState,
    slack: SlackConfig,
    payload: BlockActions,
    request_id: str,
    who: Principal,
    channel_id: str | None,
) -> SlackReply:
    """Open the modal, if the clicker may decide the request and it still waits."""
    request = pending_for(state, slack, request_id, who, channel_id)
    if not request.suggested_rules:
        return failed(notice("This request offers no rule to keep.", "invalid_rule"))
    view = ids.always_modal(request.id, request.suggested_rules, channel_id)
    return open_modal(slack, payload.trigger_id, request, view, "the dialog")


def submit_always(
    state: ApiState, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    """The modal's submission: the decision and its rule, or the error shown in the modal."""
    view = payload.view
    request_id, _, channel_id = view.private_metadata.partition(" ")
    index = ids.chosen(view.state, ids.RULE_BLOCK, ids.RULE_ACTION) or "0"
    outcome = ids.chosen(view.state, ids.OUTCOME_BLOCK, ids.OUTCOME_ACTION) or "approved"
    reason = (ids.chosen(view.state, ids.REASON_BLOCK, ids.REASON_ACTION) or "").strip() or None
    shadow = ids.chosen(view.state, ids.MODE_BLOCK, ids.MODE_ACTION) == ids.SHADOW
    try:
        who = approver_by_slack_user(state.config, payload.user.id)
        decision = Decision(
            outcome=Outcome.rejected if outcome == "rejected" else Outcome.approved,
            reason=reason[:10_000] if reason else None,
        )
        suggested = int(index) if index.isascii() and index.isdigit() and len(index) < 4 else -1
        remember(
            state,
            request_id,
            decision,
            who,
            {"suggested": suggested, "mode": "shadow"} if shadow else suggested,
            channel="slack",
            via=channels_of(slack, channel_id or None),
            once=once,
        )
    except BrokerError as exc:
        if isinstance(exc, Conflict) and exc.code == "replayed":
            raise replayed() from None
        body = {"response_action": "errors", "errors": {ids.RULE_BLOCK: refusal_text(exc)}}
        return SlackReply(body={**body, "error": exc.code}, decided=True)
    return SlackReply(body={"response_action": "clear"}, decided=True)
