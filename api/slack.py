"""Slack interactivity (`POST /v1/slack/interactions`): button clicks, the reject-reason modal
and the answer form of a structured question (`broker.slack_forms`).

The v0 signature is checked over the raw body (slack_sdk's SignatureVerifier, 5-minute window)
before anything is parsed, and a signature is accepted once (an exact replay is refused): a
click's signature is spent in the same atomic step as the decision it carries, so a click whose
decision failed (Redis gone for a moment) can be sent again and still count. A click decides
only when it comes from a Slack channel of the queue the request waits in now.
Slack wants an answer within 3 seconds: the decision is one Lua call made inline, and the only
Slack API call on this path (views.open, bound to the click's 3-second trigger_id) has a short
timeout. Updating the message after a decision is the notifier's job (it sees the event).

A clicking user who may not decide gets HTTP 200 with an ephemeral-style JSON body, and the
same text is posted to the interaction's `response_url` after the answer: a non-200 would only
make Slack show a generic warning, never why.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs

import httpx
from fastapi import APIRouter, BackgroundTasks, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError
from slack_sdk.signature import SignatureVerifier
from starlette.concurrency import run_in_threadpool

from api.auth import approver_by_slack_user
from api.errors import ApiError
from api.schemas import ERRORS, ErrorBody
from api.state import ApiState, State
from broker import slack_always as always
from broker import slack_ids as ids
from broker.auth import Principal
from broker.client import Once
from broker.config import SlackConfig
from broker.deciding import REPLAY_TTL_S
from broker.errors import BrokerError, Conflict, InvalidInput
from broker.models import Decision, Outcome
from broker.models import Request as BrokerRequest
from broker.questions import InvalidAnswer, has_form
from broker.slack_forms import (
    ANSWER_FORM,
    ANSWER_FORM_CALLBACK,
    answer_from_view_state,
    answer_modal,
    errors_for,
)
from broker.slack_urls import response_url_allowed

log = logging.getLogger("approval_broker.api")

router = APIRouter(prefix="/v1/slack", tags=["slack"])

SLACK_API_TIMEOUT_S = 2.0  # views.open must land within the trigger_id's 3 seconds
RESPONSE_URL_TIMEOUT_S = 5.0
MAX_REASON = 10_000  # what a Decision's reason may hold
DECIDING_ACTIONS = frozenset(
    {ids.APPROVE, ids.REJECT, ids.ESCALATE, ids.ANSWER, ids.ACK, ANSWER_FORM, always.ALWAYS}
)


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


def verify(slack: SlackConfig, body: bytes, headers: dict[str, str]) -> str:
    """The request's signature, once it is known to be Slack's and recent; else 401."""
    try:
        valid = SignatureVerifier(slack.signing_secret).is_valid_request(body, headers)
    except (ValueError, TypeError):  # a timestamp that is not a number, a body not UTF-8
        valid = False
    if not valid:
        raise ApiError(401, "bad_signature", "the Slack signature is missing, wrong or too old")
    return headers["x-slack-signature"]


def parse_payload(body: bytes) -> dict[str, Any]:
    try:
        fields = parse_qs(body.decode("utf-8"), strict_parsing=True)
        payload = json.loads(fields["payload"][0])
    except (ValueError, KeyError, IndexError):
        raise ApiError(400, "bad_request", "expected a form field 'payload' holding JSON") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "bad_request", "the payload must be a JSON object")
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


def notice(text: str, error: str | None = None) -> dict[str, Any]:
    """An ephemeral message body (also what is posted to the response_url)."""
    body: dict[str, Any] = {"response_type": "ephemeral", "replace_original": False, "text": text}
    if error:
        body["error"] = error
    return body


def _post_notice(url: str, body: dict[str, Any]) -> None:
    try:
        httpx.post(url, json=body, timeout=RESPONSE_URL_TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.warning("could not post to Slack's response_url: %s", type(exc).__name__)


def explain(exc: BrokerError) -> str:
    if isinstance(exc, Conflict):
        decision = exc.request.decision
        who = f" by {decision.decided_by}" if decision and decision.decided_by else ""
        return f"Too late: this request was already {exc.request.status.value}{who}."
    return exc.detail


def open_view(slack: SlackConfig, trigger_id: str, view: dict[str, Any]) -> None:
    base_url = slack.api_base_url if slack.api_base_url.endswith("/") else slack.api_base_url + "/"
    client = WebClient(token=slack.bot_token, base_url=base_url, timeout=SLACK_API_TIMEOUT_S)
    client.views_open(trigger_id=trigger_id, view=view)


def open_reject_modal(
    slack: SlackConfig, trigger_id: str, request: BrokerRequest, channel_id: str | None
) -> None:
    open_view(slack, trigger_id, ids.reject_modal(request.id, request.tool_name, channel_id))


def open_answer_modal(
    slack: SlackConfig, trigger_id: str, request: BrokerRequest, channel_id: str | None
) -> None:
    """The question's form; its private metadata names the request and the click's channel,
    as the reject modal's does (`slack_ids.parse_modal_metadata` reads both)."""
    view = answer_modal(request)
    if channel_id:
        view["private_metadata"] = f"{request.id} {channel_id}"
    open_view(slack, trigger_id, view)


def channels_of(slack: SlackConfig, channel_id: str | None) -> list[str]:
    """The configured channels (`slack:NAME`) that a Slack channel id stands for."""
    return [f"slack:{name}" for name, c in slack.channels.items() if c.channel == channel_id]


def _replayed() -> ApiError:
    return ApiError(409, "replayed", "this Slack request was already received")


@dataclass(frozen=True)
class SlackReply:
    """What the handler answers Slack with, and what (if anything) to post afterwards."""

    body: dict[str, Any]
    follow_up: dict[str, Any] | None = None
    decided: bool = False  # went through the decision step, which spends the signature itself


def _decision_for(action: SlackAction, payload: BlockActions) -> Decision | str | None:
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
    state: ApiState, slack: SlackConfig, payload: BlockActions, once: Once
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
        principal = approver_by_slack_user(state.config, payload.user.id)
        if action.action_id == ids.ACK:
            return _ack(state, slack, action.value, principal, channel_id)
        if action.action_id == ids.REJECT:
            return _start_reject(state, slack, payload, action.value, principal, channel_id)
        if action.action_id == always.ALWAYS:  # the modal of rules (api/slack_always.py)
            from api.slack_always import start_always

            return start_always(state, slack, payload, action.value, principal, channel_id)
        if action.action_id == ANSWER_FORM:
            return _start_answer(state, slack, payload, action.value, principal, channel_id)
        decision = _decision_for(action, payload)
        if decision is None:
            return SlackReply(body={})
        if isinstance(decision, str):
            return _failed(notice(decision, "invalid"))
        request = state.decide(
            action.value,
            decision,
            principal,
            channel="slack",
            via=channels_of(slack, channel_id),
            once=once,
        )
    except Conflict as exc:
        if exc.code == "replayed":
            raise _replayed() from None
        return _failed(notice(explain(exc), exc.code))
    except BrokerError as exc:
        return _failed(notice(explain(exc), exc.code))
    body = {"ok": True, "request_id": request.id, "status": request.status.value}
    return SlackReply(body=body, decided=True)


def _ack(
    state: ApiState, slack: SlackConfig, request_id: str, who: Principal, channel_id: str | None
) -> SlackReply:
    """ "I'm on it": the request stays pending and its escalation waits; the clicker hears back
    here, and the notifier updates the message on the `approval.acked` event."""
    request = state.deciding.ack(request_id, who, via=channels_of(slack, channel_id))
    until = request.acked_until.strftime("%H:%M UTC") if request.acked_until else "a while"
    text = f"You're on it: escalation of this request is paused until {until}."
    return SlackReply(
        body={"ok": True, "request_id": request.id, "status": "pending", **notice(text)},
        follow_up=notice(text),
    )


def _failed(body: dict[str, Any]) -> SlackReply:
    return SlackReply(body=body, follow_up=body, decided=True)


def _start_reject(
    state: ApiState,
    slack: SlackConfig,
    payload: BlockActions,
    request_id: str,
    who: Principal,
    channel_id: str | None,
) -> SlackReply:
    request = state.broker.get_request(request_id)
    state.deciding.check_may_decide(who, request, channels_of(slack, channel_id))
    if not request.is_pending:
        raise Conflict(f"request {request.id} is already {request.status.value}", request=request)
    if not payload.trigger_id:
        return _failed(notice("Slack sent no trigger_id; can't open the reason dialog.", "invalid"))
    try:
        open_reject_modal(slack, payload.trigger_id, request, channel_id)
    except (SlackClientError, OSError) as exc:
        log.warning("views.open failed: %s", type(exc).__name__)
        return _failed(notice("Could not open the reason dialog; please try again.", "slack"))
    return SlackReply(body={"ok": True, "request_id": request.id, "status": "pending"})


def _start_answer(
    state: ApiState,
    slack: SlackConfig,
    payload: BlockActions,
    request_id: str,
    who: Principal,
    channel_id: str | None,
) -> SlackReply:
    """The "Answer…" button: the checks of starting a rejection, then the form (views.open)."""
    request = state.broker.get_request(request_id)
    state.deciding.check_may_decide(who, request, channels_of(slack, channel_id))
    if not request.is_pending:
        raise Conflict(f"request {request.id} is already {request.status.value}", request=request)
    if not has_form(request.metadata):
        return _failed(notice("This request has no answer form.", "invalid"))
    if not payload.trigger_id:
        return _failed(notice("Slack sent no trigger_id; can't open the answer form.", "invalid"))
    try:
        open_answer_modal(slack, payload.trigger_id, request, channel_id)
    except (SlackClientError, OSError) as exc:
        log.warning("views.open failed: %s", type(exc).__name__)
        return _failed(notice("Could not open the answer form; please try again.", "slack"))
    return SlackReply(body={"ok": True, "request_id": request.id, "status": "pending"})


def submit_answer(
    state: ApiState, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    """The answer form submitted: read, checked and decided; a refusal keeps the modal open
    with each error beside its input (`response_action: "errors"`)."""
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
            raise _replayed() from None
        where = request if request is not None and has_form(request.metadata) else None
        body = {**errors_for(InvalidAnswer(explain(exc)), where), "error": exc.code}
        return SlackReply(body=body, decided=True)
    return SlackReply(body={"response_action": "clear"}, decided=True)


def handle_view_submission(
    state: ApiState, slack: SlackConfig, payload: ViewSubmission, once: Once
) -> SlackReply:
    view = payload.view
    if view.callback_id == always.ALWAYS_CALLBACK:  # a decision that keeps a rule
        from api.slack_always import submit_always

        return submit_always(state, slack, payload, once)
    if view.callback_id == ANSWER_FORM_CALLBACK:
        return submit_answer(state, slack, payload, once)
    if view.callback_id != ids.REJECT_CALLBACK:
        return SlackReply(body={})
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
    except Conflict as exc:
        if exc.code == "replayed":
            raise _replayed() from None
        errors = {ids.REJECT_REASON_BLOCK: explain(exc)}
        body = {"response_action": "errors", "errors": errors, "error": exc.code}
        return SlackReply(body=body, decided=True)
    except BrokerError as exc:
        errors = {ids.REJECT_REASON_BLOCK: explain(exc)}
        body = {"response_action": "errors", "errors": errors, "error": exc.code}
        return SlackReply(body=body, decided=True)
    return SlackReply(body={"response_action": "clear"}, decided=True)


def handle(state: ApiState, slack: SlackConfig, payload: dict[str, Any], once: Once) -> SlackReply:
    """What to answer; a deciding interaction spends `once` with its decision."""
    kind = payload.get("type")
    try:
        if kind == "block_actions":
            return handle_block_actions(state, slack, BlockActions.model_validate(payload), once)
        if kind == "view_submission":
            submission = ViewSubmission.model_validate(payload)
            return handle_view_submission(state, slack, submission, once)
    except ValidationError:
        raise ApiError(400, "bad_request", f"malformed Slack {kind} payload") from None
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
        **ERRORS,
    },
)
async def slack_interactions(
    request: Request, background: BackgroundTasks, state: State
) -> JSONResponse:
    """Slack block actions (approve, reject, escalate, answer) and the reject-reason modal."""
    slack = state.config.slack
    if slack is None:
        raise ApiError(404, "not_configured", "Slack is not configured")
    body = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    signature = verify(slack, body, headers)
    payload = parse_payload(body)
    seen = state.broker.keys.seen("slack", hashlib.sha256(signature.encode()).hexdigest())
    if await run_in_threadpool(state.broker.redis.exists, seen):
        raise _replayed()
    outcome = await run_in_threadpool(handle, state, slack, payload, (seen, REPLAY_TTL_S))
    if not outcome.decided:  # opening the reason dialog and the like: spend it here
        await run_in_threadpool(state.broker.redis.set, seen, "1", ex=REPLAY_TTL_S)
    url = payload.get("response_url")
    if outcome.follow_up and isinstance(url, str) and response_url_allowed(url, slack.api_base_url):
        background.add_task(_post_notice, url, outcome.follow_up)
    return JSONResponse(outcome.body)
