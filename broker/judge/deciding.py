"""The judge's checks: who may decide, as which person, and what can apply, as pure functions.

REST and the inbox, Slack, Teams, Telegram, Discord, email links, webhook replies, MCP and
`approval-broker decide` all reach these through `broker.judge.Judge`. They say who may decide
(the request's and its queue's roles, and whether the reply came through a deciding channel of
the queue the request waits in now), as which person (`broker.domain.persons`: one vote each,
and the one who asked never approves), whether a decision can apply to the request (kind,
`args_hash`, `modified` args against the tool's schema, an answer against its schema, an
escalation only along its queue's `escalate_to` chain), and what counts as a harmless repeat.

Each is a function of (request, decision, decider, via, config) and reads nothing: `plan`
turns a decision into the atomic step to run (`broker.store.decide_step.Step`) or an early
answer (`Decided`, a harmless repeat); `repeat_of` says whether the step's `Conflict` is a
repeat too. The Lua steps keep state only (still pending, still in that queue after as many
escalations, marker unspent, one vote per person and the quorum count, the outbox write).
The names: `decider` is the person deciding (a `Principal`), `decided_by` the name recorded,
`via` the channel(s) the reply came through, `once` its one-time marker.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta

from broker.domain.args_schema import check_args
from broker.domain.config import Config
from broker.domain.errors import Conflict, Forbidden, InvalidInput
from broker.domain.models import Decision, Outcome, Request, utcnow
from broker.domain.persons import same_person, voter_of
from broker.domain.principals import EVERY_ROLE, Principal
from broker.domain.questions import validate_answer
from broker.domain.quorum import is_approval, repeated_vote
from broker.domain.rules.models import Rule
from broker.store.decide_step import Once, Step, stale_args, wrong_kind

# One-time markers of signed replies (Slack signatures, webhook-ids) are accepted from 5
# minutes in the past to 5 in the future: each must be remembered for longer than that span.
REPLAY_TTL_S = 15 * 60

# A second escalation by the same person this soon after their first is a repeat (double click,
# retry), not a request to escalate one queue further.
REPEAT_ESCALATION_WINDOW = timedelta(minutes=5)

INBOX = "inbox"  # the channel a bearer token decides through (the inbox page, REST)


@dataclass(frozen=True)
class Decided:
    """The request as recorded, whether this call recorded something new (False: a repeat),
    the channel it was recorded through (`channel_of`; empty for a repeat), and for a
    decision that kept a rule, the rule and the siblings it decided with it."""

    request: Request
    recorded: bool
    channel: str = ""
    rule: Rule | None = None
    siblings: tuple[str, ...] = ()


def same_decision(stored: Decision | None, given: Decision, decided_by: str) -> bool:
    """Is `given`, from `decided_by`, the decision already recorded (a harmless repeat)?"""
    return (
        stored is not None
        and stored.decided_by == decided_by
        and stored.outcome == given.outcome
        and stored.reason == given.reason
        and stored.args == given.args
        and stored.answer == given.answer
    )


def repeated_escalation(request: Request, decision: Decision, decided_by: str) -> bool:
    """Was the request's latest escalation this person's, just now, to this target?

    Deliveries are recorded in the history too, so look for the latest escalation, not the
    latest entry.
    """
    last = next((h for h in reversed(request.history) if h.event == "escalated"), None)
    return (
        last is not None
        and last.by == decided_by
        and (decision.target is None or decision.target == last.to_queue)
        and utcnow() - last.at < REPEAT_ESCALATION_WINDOW
    )


# ---- who may decide ------------------------------------------------------------------------


def refusal(
    request: Request, decider: Principal, via: Collection[str], config: Config
) -> str | None:
    """Why `decider`, replying through the channels `via`, may not decide `request`."""
    if EVERY_ROLE in decider.roles:
        return None
    queue_roles = config.queue_roles(request.queue)
    if not decider.may_decide(request, queue_roles):
        if not decider.decides_anything():
            needs = "an approver's role ('requester' alone only asks, 'auditor' only reads)"
        elif queue_roles and not decider.roles.intersection(queue_roles):
            needs = f"one of the roles of queue {request.queue} ({', '.join(queue_roles)})"
        else:
            needs = f"one of the roles {', '.join(request.allowed_roles)}"
        return f"{decider.name!r} may not decide request {request.id}: it needs {needs}"
    queue = config.queues.get(request.queue)
    channels = queue.channels if queue else []
    if not set(via).intersection(channels):
        through = ", ".join(sorted(via)) or "no channel it may decide through"
        return (
            f"{decider.name!r} may not decide request {request.id} through {through}:"
            f" queue {request.queue} is decided through {', '.join(channels) or 'nothing'}"
        )
    return None


def check_channels(decider: Principal, via: Collection[str], config: Config) -> None:
    """Refuse a reply through a notify-only channel (a webhook endpoint with `decides =
    false`) before anything is read: it decides nothing, whatever the request."""
    refused = [c for c in via if not config.decides_through(c)]
    if refused:
        raise Forbidden(
            f"{decider.name!r} may not decide: {refused[0]} is notify-only (its endpoint"
            " has decides = false)"
        )


def check_may_decide(
    request: Request, decider: Principal, via: Collection[str], config: Config
) -> None:
    check_channels(decider, via, config)
    problem = refusal(request, decider, via, config)
    if problem:
        raise Forbidden(problem)


def check_not_creator(
    request: Request, decision: Decision, decider: Principal, decided_by: str, config: Config
) -> None:
    """The one who asked for the call never approves it, through any channel and under any
    spelling of their name (`broker.domain.persons`); the step refuses the creator's vote too.

    The admin token and the shell are exempt: they could write Redis anyway.
    """
    if (
        is_approval(decision)
        and request.created_by
        and same_person(config, request.created_by, decided_by)
        and EVERY_ROLE not in decider.roles
    ):
        raise Forbidden(
            f"{decided_by!r} asked for request {request.id} and may not approve it: the"
            " one who asks never counts as an approver",
            code="creator_may_not_approve",
        )


def channel_of(request: Request, via: Collection[str], config: Config) -> str:
    """The channel a reply came through, as a vote records it (the shell: `shell`)."""
    queue = config.queues.get(request.queue)
    channels = queue.channels if queue else []
    matched = [c for c in via if c in channels]
    return (matched or list(via) or ["shell"])[0]


# ---- what can apply ------------------------------------------------------------------------


def chain(queue: str, config: Config) -> list[str]:
    """The queues a request in `queue` may be escalated to by hand: its `escalate_to`, that
    queue's, and so on (the config refuses loops)."""
    out: list[str] = []
    nxt = config.escalation_target(queue)
    while nxt is not None and nxt not in out:
        out.append(nxt)
        nxt = config.escalation_target(nxt)
    return out


def check_chain(request: Request, decider: Principal, target: str, config: Config) -> None:
    """A person escalates only along the chain; the admin and the shell (every role) may
    send a request anywhere, back to an earlier queue too."""
    if EVERY_ROLE in decider.roles:
        return
    along_chain = chain(request.queue, config)
    if target not in along_chain:
        along = (
            " -> ".join([request.queue, *along_chain]) if along_chain else f"{request.queue} (none)"
        )
        raise Forbidden(
            f"{decider.name!r} may escalate request {request.id} only along its queue's"
            f" escalate_to chain ({along}), not to {target!r}"
        )


def check_applies(request: Request, decision: Decision, config: Config) -> Decision:
    """The decision, checked against what can't change about the request (its kind, args
    and the config); an escalation gets its target filled in.

    Naming the target explicitly means a request that someone else moved there meanwhile
    is not moved one queue further.
    """
    outcome = decision.outcome
    if outcome is Outcome.timed_out:
        raise InvalidInput(
            "'timed_out' is recorded by the sweeper; it can't be given as a decision"
        )
    approval = request.kind == "approval"
    if (outcome in (Outcome.approved, Outcome.modified) and not approval) or (
        outcome is Outcome.answered and approval
    ):
        raise wrong_kind(outcome.value, request.kind)
    if decision.args_hash is not None and decision.args_hash != request.args_hash:
        raise stale_args(request.id)
    if outcome is Outcome.modified and decision.args is not None:
        check_args(request.args_schema, decision.args)
    if outcome is not Outcome.escalated:
        return decision
    target = decision.target or config.escalation_target(request.queue)
    if target is None:
        raise InvalidInput(
            f"queue {request.queue!r} has no escalate_to; name a target queue", code="no_target"
        )
    if target not in config.queues:
        known = ", ".join(sorted(config.queues))
        raise InvalidInput(
            f"queue {target!r} is not defined (known: {known})", code="unknown_queue"
        )
    if target == request.queue:
        raise InvalidInput(
            f"request {request.id} is already in queue {target!r}", code="same_queue"
        )
    return decision.model_copy(update={"target": target})


def checks_schemas(decision: Decision) -> bool:
    """Does `plan` check this decision against a schema (`modified` args, an answer): work
    bounded by `broker.domain.schema_safety`, but a thread's, never an event loop's."""
    return decision.outcome is Outcome.answered or (
        decision.outcome is Outcome.modified and decision.args is not None
    )


# ---- the plan --------------------------------------------------------------------------------


def plan(
    request: Request,
    decision: Decision,
    decider: Principal,
    via: Collection[str],
    config: Config,
    *,
    decided_by: str,
    once: Once | None = None,
) -> Step | Decided:
    """The step that records `decision` on `request` (as read) for `decider`, recorded as
    `decided_by`, or the early answer to a harmless repeat (the same person's escalation or
    vote again).

    Raises Forbidden (roles, a channel outside the request's queue, the creator's own
    approval, an escalation off its queue's chain), InvalidInput (`invalid_args`, `stale_args`,
    `wrong_kind`, a bad escalation target), InvalidAnswer, or Conflict for an escalation to
    the default target of a request no longer pending. The step binds the request's queue and
    escalation count as read, so a request moved meanwhile is `Conflict` code `escalated`.
    """
    voter = voter_of(config, decided_by)  # one person, whatever the channel
    if decision.outcome is Outcome.escalated and repeated_escalation(request, decision, decided_by):
        return Decided(request, recorded=False)
    check_may_decide(request, decider, via, config)
    check_not_creator(request, decision, decider, decided_by, config)
    if request.is_pending and repeated_vote(request, decision, voter):
        return Decided(request, recorded=False)  # the step would say 'repeat' too
    if request.is_pending:
        decision = check_applies(request, decision, config)
        if decision.target is not None:
            check_chain(request, decider, decision.target, config)
    elif decision.outcome is Outcome.escalated and decision.target is None:
        raise Conflict(f"request {request.id} is already {request.status.value}", request=request)
    if decision.outcome is Outcome.answered:  # InvalidAnswer (422) before it can count
        decision = decision.model_copy(
            update={"answer": validate_answer(request.metadata, decision.answer)}
        )
    # else the atomic step answers: replayed marker, or who won (maybe this very decision)
    return Step(
        request.id,
        decision,
        decided_by,
        voter=voter,
        in_queue=request.queue,
        in_escalation=request.escalations,
        once=once,
        channel=channel_of(request, via, config),
        creator_may_vote=EVERY_ROLE in decider.roles,
        request=request,
    )


def repeat_of(conflict: Conflict, step: Step) -> bool:
    """Is the step's `Conflict` this very decision (or vote) recorded before: a repeat."""
    return conflict.code == "conflict" and (
        same_decision(conflict.request.decision, step.decision, step.decided_by)
        or repeated_vote(conflict.request, step.decision, step.voter or step.decided_by)
    )
