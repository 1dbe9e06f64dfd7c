"""Slack view submissions: the reject-reason modal, the answer form of a structured question
(`channels.slack.question_modal`) and, routed on, the "Always…" modal (`channels/slack/always.py`).

A refusal keeps the modal open with the error beside its input (`response_action: "errors"`);
a decision closes it (`"clear"`). Each submission spends the signature with its decision.
"""

from __future__ import annotations

from broker.domain.errors import BrokerError, Conflict, InvalidInput
from broker.domain.models import Decision, Outcome
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import approver_with
from broker.domain.questions import InvalidAnswer, has_form
from broker.facade import Once
from channels.inbound import InboundHost
from channels.refusals import refusal_text
from channels.slack import action_ids as ids
from channels.slack import always_modal as always
from channels.slack.always import submit_always
from channels.slack.config import SlackConfig
from channels.slack.payloads import ViewSubmission, input_value
from channels.slack.question_modal import (
    ANSWER_FORM_CALLBACK,
    answer_from_view_state,
    errors_for,
)
from channels.slack.replies import SlackReply, channels_of
from channels.slack.signature import replayed

MAX_REASON = 10_000  # what a Decision's reason may hold


def handle_view_submission(
    host: InboundHost, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    callback_id = payload.view.callback_id
    if callback_id == always.ALWAYS_CALLBACK:  # a decision that keeps a rule
        return submit_always(host, slack, payload, once)
    if callback_id == ANSWER_FORM_CALLBACK:
        return submit_answer(host, slack, payload, once)
    if callback_id == ids.REJECT_CALLBACK:
        return submit_reject(host, slack, payload, once)
    return SlackReply(body={})


def submit_reject(
    host: InboundHost, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    """The reason dialog submitted: the rejection, or the error shown beside the reason."""
    view = payload.view
    reason = (input_value(view.state, ids.REJECT_REASON_ACTION) or "").strip() or None
    if reason and len(reason) > MAX_REASON:
        errors = {ids.REJECT_REASON_BLOCK: f"Please keep the reason under {MAX_REASON} characters."}
        return SlackReply(body={"response_action": "errors", "errors": errors, "error": "invalid"})
    request_id, channel_id = ids.parse_modal_metadata(view.private_metadata)
    try:
        decider = approver_with(
            host.config, "slack_user_id", payload.user.id, who=f"Slack user {payload.user.id}"
        )
        host.judge.decide(
            request_id,
            Decision(outcome=Outcome.rejected, reason=reason),
            decider,
            via=channels_of(slack, channel_id),
            once=once,
        )
    except BrokerError as exc:
        if isinstance(exc, Conflict) and exc.code == "replayed":
            raise replayed() from None
        errors = {ids.REJECT_REASON_BLOCK: refusal_text(exc)}
        body = {"response_action": "errors", "errors": errors, "error": exc.code}
        return SlackReply(body=body, decided=True)
    return SlackReply(body={"response_action": "clear"}, decided=True)


def submit_answer(
    host: InboundHost, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    """The answer form submitted: read, checked and decided; a refusal keeps the modal open
    with each error beside its input."""
    view = payload.view
    request_id, channel_id = ids.parse_modal_metadata(view.private_metadata)
    request: BrokerRequest | None = None
    try:
        decider = approver_with(
            host.config, "slack_user_id", payload.user.id, who=f"Slack user {payload.user.id}"
        )
        request = host.broker.get_request(request_id)
        if not has_form(request.metadata):
            raise InvalidInput(f"request {request.id} has no answer form")
        answer = answer_from_view_state(request, (view.state or {}).get("values") or {})
        host.judge.decide(
            request_id,
            Decision(outcome=Outcome.answered, answer=answer),
            decider,
            via=channels_of(slack, channel_id),
            current=request,
            once=once,
        )
    except InvalidAnswer as exc:
        body = {**errors_for(exc, request), "error": exc.code}
        return SlackReply(body=body, decided=True)
    except BrokerError as exc:
        if isinstance(exc, Conflict) and exc.code == "replayed":
            raise replayed() from None
        where = request if request is not None and has_form(request.metadata) else None
        body = {**errors_for(InvalidAnswer(refusal_text(exc)), where), "error": exc.code}
        return SlackReply(body=body, decided=True)
    return SlackReply(body={"response_action": "clear"}, decided=True)
