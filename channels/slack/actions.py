"""Slack block actions: a button click on a request's message.

Approve, escalate and answer (a typed answer or an option button) decide inline (one Lua call:
Slack wants an answer within 3 seconds); Reject, "Answer…" and "Always…" open a modal, whose
submission `channels/slack/modals.py` handles; "I'm on it" acks. A click decides only when it comes
from a Slack channel of the queue the request waits in now.
"""

from __future__ import annotations

from broker.domain.errors import BrokerError, Conflict
from broker.domain.models import Decision, Outcome
from broker.domain.principals import Principal, approver_with
from broker.domain.questions import has_form
from broker.facade import Once
from channels.inbound import InboundHost
from channels.refusals import refusal_text
from channels.slack import action_ids as ids
from channels.slack import always_modal as always
from channels.slack.always import start_always
from channels.slack.config import SlackConfig
from channels.slack.payloads import BlockActions, SlackAction, input_value
from channels.slack.question_modal import ANSWER_FORM, answer_modal
from channels.slack.replies import (
    SlackReply,
    channels_of,
    failed,
    notice,
    open_modal,
    pending_for,
)
from channels.slack.signature import replayed

DECIDING_ACTIONS = frozenset(
    {ids.APPROVE, ids.REJECT, ids.ESCALATE, ids.ANSWER, ids.ACK, ANSWER_FORM, always.ALWAYS}
)


def decision_for(action: SlackAction, payload: BlockActions) -> Decision | str | None:
    """The decision a button stands for; a str is a message for the user; None: not ours."""
    aid = action.action_id
    if aid == ids.APPROVE:
        return Decision(outcome=Outcome.approved)
    if aid == ids.ESCALATE:
        return Decision(outcome=Outcome.escalated)
    if aid == ids.ANSWER:
        text = (input_value(payload.state, ids.ANSWER_TEXT) or "").strip()
        return Decision(outcome=Outcome.answered, answer=text) if text else "Type an answer first."
    kind, option = ids.parse_action(aid)
    if kind == ids.ANSWER and option:
        return Decision(outcome=Outcome.answered, answer=option)
    return None


def handle_block_actions(
    host: InboundHost, slack: SlackConfig, payload: BlockActions, once: Once
) -> SlackReply:
    if not payload.actions:
        return SlackReply(body={})
    action = payload.actions[0]
    if ids.parse_action(action.action_id)[0] not in DECIDING_ACTIONS:
        return SlackReply(body={})  # e.g. the answer text box itself: nothing to do yet
    if not action.value:
        return SlackReply(body=notice("This button names no request.", "invalid"))
    channel_id = payload.channel.id if payload.channel else None
    try:
        decider = approver_with(
            host.config, "slack_user_id", payload.user.id, who=f"Slack user {payload.user.id}"
        )
        if action.action_id == ids.ACK:
            return ack(host, slack, action.value, decider, channel_id)
        if action.action_id == ids.REJECT:
            return start_reject(host, slack, payload, action.value, decider, channel_id)
        if action.action_id == always.ALWAYS:  # the modal of rules (channels/slack/always.py)
            return start_always(host, slack, payload, action.value, decider, channel_id)
        if action.action_id == ANSWER_FORM:
            return start_answer(host, slack, payload, action.value, decider, channel_id)
        decision = decision_for(action, payload)
        if decision is None:
            return SlackReply(body={})
        if isinstance(decision, str):
            return failed(notice(decision, "invalid"))
        request = host.judge.decide(
            action.value, decision, decider, via=channels_of(slack, channel_id), once=once
        ).request
    except Conflict as exc:
        if exc.code == "replayed":
            raise replayed() from None
        return failed(notice(refusal_text(exc), exc.code))
    except BrokerError as exc:
        return failed(notice(refusal_text(exc), exc.code))
    body = {"ok": True, "request_id": request.id, "status": request.status.value}
    return SlackReply(body=body, decided=True)


def ack(
    host: InboundHost,
    slack: SlackConfig,
    request_id: str,
    decider: Principal,
    channel_id: str | None,
) -> SlackReply:
    """ "I'm on it": the request stays pending and its escalation waits; the clicker hears back
    here, and the notifier updates the message on the `approval.acked` event."""
    request = host.judge.ack(request_id, decider, via=channels_of(slack, channel_id))
    until = request.acked_until.strftime("%H:%M UTC") if request.acked_until else "a while"
    text = f"You're on it: escalation of this request is paused until {until}."
    return SlackReply(
        body={"ok": True, "request_id": request.id, "status": "pending", **notice(text)},
        follow_up=notice(text),
    )


def start_reject(
    host: InboundHost,
    slack: SlackConfig,
    payload: BlockActions,
    request_id: str,
    decider: Principal,
    channel_id: str | None,
) -> SlackReply:
    """The Reject button: the reason dialog, if the clicker may decide and it still waits."""
    request = pending_for(host, slack, request_id, decider, channel_id)
    view = ids.reject_modal(request.id, request.tool_name, channel_id)
    return open_modal(slack, payload.trigger_id, request, view, "the reason dialog")


def start_answer(
    host: InboundHost,
    slack: SlackConfig,
    payload: BlockActions,
    request_id: str,
    decider: Principal,
    channel_id: str | None,
) -> SlackReply:
    """The "Answer…" button: the checks of starting a rejection, then the form. Its private
    metadata names the request and the click's channel, as the reject modal's does
    (`slack_ids.parse_modal_metadata` reads both)."""
    request = pending_for(host, slack, request_id, decider, channel_id)
    if not has_form(request.metadata):
        return failed(notice("This request has no answer form.", "invalid"))
    view = answer_modal(request)
    if channel_id:
        view["private_metadata"] = f"{request.id} {channel_id}"
    return open_modal(slack, payload.trigger_id, request, view, "the answer form")
