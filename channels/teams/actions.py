"""Teams card clicks (`Action.Execute`): from a click to a decision, and the card to answer with.

Sync code, run in a thread: it reads Redis and calls the one judge (`broker.judge.Judge`, the
host's `judge`), which checks roles, the channel binding (a
click decides only from a `[teams.channels.NAME]` conversation of the queue the request waits
in now), the creator rule and the quorum per person (a Teams user mapped to alice is alice on
every channel). The click's activity id is its one-time marker, spent with the decision: a
replayed invoke records nothing. Whatever happens, the clicker gets a card back: to one who may
decide the request, the request as it stands, with a line saying why a click was refused; to
anyone else, a card with that line alone (`channels.refusals`), nothing of the request. It never
speaks to Teams itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from broker.domain.errors import BrokerError, Conflict, Forbidden, InvalidInput, NotFound
from broker.domain.models import Decision, Outcome
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import approver_with
from broker.domain.printable import lines
from broker.domain.questions import is_structured, questions_of
from broker.judge.deciding import REPLAY_TTL_S
from channels.answer_forms import answer_from_form, question_input
from channels.inbound import InboundHost
from channels.refusals import refusal_text
from channels.teams import adaptive_cards as cards
from channels.teams.config import TeamsConfig

THREAD_REPLY = ";messageid="  # a channel post's conversation id carries its thread


@dataclass(frozen=True)
class Click:
    """What an `adaptiveCard/action` invoke says: who clicked what, where."""

    verb: str
    data: dict[str, Any]
    user_aad_id: str | None
    conversation_id: str
    tenant_id: str | None
    activity_id: str | None


@dataclass(frozen=True)
class Answer:
    """The card to answer the click with (None: a plain message, `text`)."""

    card: dict[str, Any] | None
    text: str = ""


def channels_of(teams: TeamsConfig, click: Click) -> list[str]:
    """The configured channels (`teams:NAME`) the clicked card's conversation is, in the same
    tenant when the channel names one."""
    conversation = click.conversation_id.split(THREAD_REPLY, 1)[0]
    return [
        f"teams:{name}"
        for name, c in teams.channels.items()
        if c.conversation_id.split(THREAD_REPLY, 1)[0] == conversation
        and (c.tenant_id is None or (click.tenant_id or "").casefold() == c.tenant_id.casefold())
    ]


def text_input(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    return lines(value).strip() if isinstance(value, str) else ""


def answer_of(request: BrokerRequest, data: dict[str, Any]) -> Any:
    """The answer the card's inputs hold, in the contract's shape (checked by the judge)."""
    if questions_of(request.metadata) is not None:
        form: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(value, str):
                continue
            is_choice = key.startswith("q") and not key.endswith("_other")
            form[key] = [v for v in value.split(",") if v] if is_choice else value
        for i in range(len(questions_of(request.metadata) or [])):
            form.setdefault(question_input(i), [])
        return answer_from_form(request.metadata, form)
    if is_structured(request.metadata):
        raise InvalidInput("this request's form is answered in the inbox", code="invalid")
    text = text_input(data, cards.ANSWER_INPUT)
    if not text:
        raise InvalidInput("Type or pick an answer first.", code="invalid")
    return text


def decision_for(verb: str, request: BrokerRequest, data: dict[str, Any]) -> Decision:
    if verb == cards.APPROVE:
        return Decision(outcome=Outcome.approved)
    if verb == cards.ESCALATE:
        return Decision(outcome=Outcome.escalated)
    if verb == cards.REJECT:
        reason = text_input(data, cards.REASON_INPUT)
        if not reason:
            raise InvalidInput("Type a reason first: a rejection tells the agent why.")
        return Decision(outcome=Outcome.rejected, reason=reason)
    if verb == cards.ANSWER:
        return Decision(outcome=Outcome.answered, answer=answer_of(request, data))
    raise InvalidInput(f"unknown action {verb!r}")


def refused(text: str) -> Answer:
    """A refusal card: the line alone, nothing of the request (the clicker may be anyone who
    can send an invoke naming a request id)."""
    return Answer(cards.refusal(text))


def handle_click(host: InboundHost, teams: TeamsConfig, click: Click) -> Answer:
    """Decide what the click asks for, and the card that shows the outcome to the clicker.

    Who clicked, from where, and whether they may decide the request are settled first: until
    then the answer carries nothing of the request. Past that, the clicker sees the request
    as it stands (a late click: who decided first; a reason missing: the card again)."""
    request_id = click.data.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        return refused("This card names no request.")
    via = channels_of(teams, click)
    if not via:
        return refused("This conversation is not one of the broker's Teams channels.")
    try:
        decider = approver_with(
            host.config,
            "teams_user_id",
            click.user_aad_id,
            who=f"You (Entra ID object id {click.user_aad_id or 'none sent'})",
        )
        current = host.broker.get_request(request_id)
        host.judge.check_may_decide(decider, current, via)
    except (Forbidden, NotFound) as exc:
        return refused(refusal_text(exc))
    try:
        decision = decision_for(click.verb, current, click.data)
        once = None
        if click.activity_id:
            digest = hashlib.sha256(f"{click.conversation_id} {click.activity_id}".encode())
            once = host.broker.once.marker("teams", digest.hexdigest(), REPLAY_TTL_S)
        request = host.judge.decide(
            current.id, decision, decider, via=via, current=current, once=once
        ).request
    except Conflict as exc:
        return Answer(cards.render(exc.request, host.config, via[0], note=refusal_text(exc)))
    except (Forbidden, NotFound) as exc:  # the creator rule; the request gone meanwhile
        return refused(refusal_text(exc))
    except BrokerError as exc:
        return Answer(cards.render(current, host.config, via[0], note=refusal_text(exc)))
    return Answer(cards.render(request, host.config, via[0]))
