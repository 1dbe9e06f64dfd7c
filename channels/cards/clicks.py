"""A click on a chat card's button (Telegram, Discord), whatever the platform: the token read
(`channels.cards.button_tokens`), the clicker as an approver, and the decision service asked.

Every click goes through the one judge (`broker.judge.Judge`, the host's `judge`; with the rule
to keep for "Approve always"), with the channels the click came from (`via`), so roles, channel
binding, the creator rule and one vote per person hold as on every channel.
The platform modules (`channels/telegram/routes.py`, `channels/discord/routes.py`) verify, parse and turn a
`ClickResult` into their own answer; nothing here speaks a platform's protocol. What a refused
clicker reads comes from `channels.refusals`: nothing of the request, its queue or its channels.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from broker.domain.errors import BrokerError, Conflict
from broker.domain.models import Decision, Outcome
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import approver_with
from broker.facade import Once
from channels.cards import button_tokens as ids
from channels.cards.answer_options import option_answer
from channels.inbound import InboundHost
from channels.refusals import refusal_text

MAX_REASON = 10_000  # what a Decision's reason may hold


class Result(StrEnum):
    decided = "decided"  # recorded (or a harmless repeat)
    acked = "acked"  # "I'm on it"
    ask_reason = "ask_reason"  # Reject: the platform now asks for the reason
    always = "always"  # Always…: the platform now shows the rule buttons
    refused = "refused"  # not decided; `text` says why (the host is unchanged)
    replayed = "replayed"  # this very click was handled before


@dataclass(frozen=True)
class ClickResult:
    result: Result
    text: str
    request: BrokerRequest | None = None


def _done(request: BrokerRequest) -> str:
    if request.is_pending:
        return "Your vote is counted." if request.approvals else "Done."
    return f"Done: {request.status.value.replace('_', ' ')}."


def click(
    host: InboundHost,
    platform: str,
    token: str,
    user_id: str,
    via: Collection[str],
    once: Once,
) -> ClickResult:
    """Handle the button `token` clicked by platform user `user_id` in a chat of `via`."""
    parsed = ids.parse(token)
    if parsed is None:
        return ClickResult(Result.refused, "This button names no request.")
    verb, index, request_id = parsed
    try:
        decider = approver_with(
            host.config,
            f"{platform}_user_id",
            user_id,
            who=f"{platform.capitalize()} user {user_id}",
        )
        if verb in (ids.REJECT, ids.ALWAYS):
            request = host.broker.get_request(request_id)
            host.judge.check_may_decide(decider, request, via)
            if not request.is_pending:
                raise Conflict(f"request {request.id} is decided", request=request)
            if verb == ids.ALWAYS:
                if not request.suggested_rules:
                    return ClickResult(Result.refused, "This request offers no rule to keep.")
                return ClickResult(Result.always, "Choose the rule to keep.", request)
            return ClickResult(Result.ask_reason, "Why reject it?", request)
        if verb == ids.ACK:
            request = host.judge.ack(request_id, decider, via=via)
            return ClickResult(Result.acked, "You're on it: escalation is paused.", request)
        if verb == ids.ALWAYS_RULE and index is not None:
            decision = Decision(outcome=Outcome.approved)
            done = host.judge.decide(
                request_id, decision, decider, via=via, once=once, remember=index
            )
            return ClickResult(Result.decided, _done(done.request), done.request)
        if verb == ids.APPROVE:
            decision = Decision(outcome=Outcome.approved)
        elif verb == ids.ESCALATE:
            decision = Decision(outcome=Outcome.escalated)
        elif verb == ids.OPTION and index is not None:
            current = host.broker.get_request(request_id)
            answer = option_answer(current, index)
            if answer is None:
                return ClickResult(Result.refused, "That option is no longer offered.")
            decision = Decision(outcome=Outcome.answered, answer=answer)
        else:
            return ClickResult(Result.refused, "This button does nothing here.")
        done = host.judge.decide(request_id, decision, decider, via=via, once=once)
        return ClickResult(Result.decided, _done(done.request), done.request)
    except Conflict as exc:
        if exc.code == "replayed":
            return ClickResult(Result.replayed, "Already received.")
        return ClickResult(Result.refused, refusal_text(exc), exc.request)
    except BrokerError as exc:
        return ClickResult(Result.refused, refusal_text(exc))


def reject(
    host: InboundHost,
    platform: str,
    request_id: str,
    reason: str,
    user_id: str,
    via: Collection[str],
    once: Once,
) -> ClickResult:
    """The reason given (a reply to Telegram's prompt, Discord's modal): the rejection."""
    reason = reason.strip()
    if len(reason) > MAX_REASON:
        return ClickResult(Result.refused, f"Please keep the reason under {MAX_REASON} characters.")
    try:
        decider = approver_with(
            host.config,
            f"{platform}_user_id",
            user_id,
            who=f"{platform.capitalize()} user {user_id}",
        )
        decision = Decision(outcome=Outcome.rejected, reason=reason or None)
        request = host.judge.decide(request_id, decision, decider, via=via, once=once).request
    except Conflict as exc:
        if exc.code == "replayed":
            return ClickResult(Result.replayed, "Already received.")
        return ClickResult(Result.refused, refusal_text(exc), exc.request)
    except BrokerError as exc:
        return ClickResult(Result.refused, refusal_text(exc))
    return ClickResult(Result.decided, _done(request), request)
