"""Slack view submissions: the reject-reason modal, the answer form of a structured question
(`broker.channels.slack.question_modal`) and, routed on, the "Always…" modal (`api/slack_always.py`).

A refusal keeps the modal open with the error beside its input (`response_action: "errors"`);
a decision closes it (`"clear"`). Each submission spends the signature with its decision.
"""

from __future__ import annotations

from api.auth import approver_by_slack_user
from api.refusals import refusal_text
from api.slack_always import submit_always
from api.slack_payloads import ViewSubmission, input_value
from api.slack_replies import SlackReply, channels_of
from api.slack_signature import replayed
from api.state import ApiState
from broker.channels.slack import action_ids as ids
from broker.channels.slack import always_modal as always
from broker.channels.slack.question_modal import (
    ANSWER_FORM_CALLBACK,
    answer_from_view_state,
    errors_for,
)
from broker.domain.config import SlackConfig
from broker.domain.errors import BrokerError, Conflict, InvalidInput
from broker.domain.models import Decision, Outcome
from broker.domain.models import Request as BrokerRequest
from broker.domain.questions import InvalidAnswer, has_form
from broker.store.decisions import Once

MAX_REASON = 10_000  # what a Decision's reason may hold


def handle_view_submission(
    state: ApiState, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    callback_id = payload.view.callback_id
    if callback_id == always.ALWAYS_CALLBACK:  # a decision that keeps a rule
        return submit_always(state, slack, payload, once)
    if callback_id == ANSWER_FORM_CALLBACK:
        return submit_answer(state, slack, payload, once)
    if callback_id == ids.REJECT_CALLBACK:
        return submit_reject(state, slack, payload, once)
    return SlackReply(body={})


def submit_reject(
    state: ApiState, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    """The reason dialog submitted: the rejection, or the error shown beside the reason."""
    view = payload.view
    reason = (input_value(view.state, ids.REJECT_REASON_ACTION) or "").strip() or None
    if reason and len(reason) > MAX_REASON:
        errors = {ids.REJECT_REASON_BLOCK: f"Please keep the reason under {MAX_REASON} characters."}
        return SlackReply(body={"response_action": "errors", "errors": errors, "error": "invalid"})
    request_id, channel_id = ids.parse_modal_metadata(view.private_metadata)
    try:
        principal = approver_by_slack_user(state.config, payload.user.id)
        state.decide(
            request_id,
            Decision(outcome=Outcome.rejected, reason=reason),
            principal,
            channel="slack",
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
    state: ApiState, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    """The answer form submitted: read, checked and decided; a refusal keeps the modal open
    with each error beside its input."""
    view = payload.view
    request_id, channel_id = ids.parse_modal_metadata(view.private_metadata)
    request: BrokerRequest | None = None
    try:
        principal = approver_by_slack_user(state.config, payload.user.id)
        request = state.broker.get_request(request_id)
        if not has_form(request.metadata):
            raise InvalidInput(f"request {request.id} has no answer form")
        answer = answer_from_view_state(request, (view.state or {}).get("values") or {})
        state.decide(
            request_id,
            Decision(outcome=Outcome.answered, answer=answer),
            principal,
            channel="slack",
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
