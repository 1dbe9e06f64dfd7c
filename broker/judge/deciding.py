"""The decision service, the one judge: every channel decides through `Deciding.decide`.

REST and the inbox, Slack, email links, webhook replies and `approval-broker decide` all end
here. It says who may decide (the request's and its queue's roles, and whether the reply came
through a deciding channel of the queue the request waits in now), as which person
(`broker.domain.persons`: one vote each, and the one who asked never approves), whether a decision
can apply to the request (kind, `args_hash`, `modified` args against the tool's schema, an
answer against its schema, an escalation only along its queue's `escalate_to` chain), and what
counts as a harmless repeat; what a remembered rule covers is `broker.domain.rules.matching`'s, fed
the same queue roles and deciding channels. The Lua steps keep state only (still pending,
still in that queue after as many escalations, marker unspent, one vote per person and the
quorum count, the outbox write). Sync callers call it directly; the API runs it in a thread.
It never speaks HTTP and never records metrics: the API wraps it.
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
from broker.domain.printable import printable
from broker.domain.questions import validate_answer
from broker.domain.quorum import is_approval, repeated_vote
from broker.facade import Broker, Once
from broker.store.acknowledging import Acks
from broker.store.decisions import stale_args, wrong_kind

# One-time markers of signed replies (Slack signatures, webhook-ids) are accepted from 5
# minutes in the past to 5 in the future: each must be remembered for longer than that span.
REPLAY_TTL_S = 15 * 60

# A second escalation by the same person this soon after their first is a repeat (double click,
# retry), not a request to escalate one queue further.
REPEAT_ESCALATION_WINDOW = timedelta(minutes=5)

INBOX = "inbox"  # the channel a bearer token decides through (the inbox page, REST)


@dataclass(frozen=True)
class Decided:
    """The request as recorded, and whether this call recorded something new (False: a repeat)."""

    request: Request
    recorded: bool


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


class Deciding:
    """Decide requests on `broker` for principals replying through named channels."""

    def __init__(self, broker: Broker, config: Config | None = None) -> None:
        self.broker = broker
        self.config = config or broker.config

    # ---- who may decide --------------------------------------------------------------------

    def refusal(self, principal: Principal, request: Request, via: Collection[str]) -> str | None:
        """Why `principal`, replying through the channels `via`, may not decide `request`."""
        if EVERY_ROLE in principal.roles:
            return None
        queue_roles = self.config.queue_roles(request.queue)
        if not principal.may_decide(request, queue_roles):
            if not principal.decides_anything():
                needs = "an approver's role ('requester' alone only asks, 'auditor' only reads)"
            elif queue_roles and not principal.roles.intersection(queue_roles):
                needs = f"one of the roles of queue {request.queue} ({', '.join(queue_roles)})"
            else:
                needs = f"one of the roles {', '.join(request.allowed_roles)}"
            return f"{principal.name!r} may not decide request {request.id}: it needs {needs}"
        queue = self.config.queues.get(request.queue)
        channels = queue.channels if queue else []
        if not set(via).intersection(channels):
            through = ", ".join(sorted(via)) or "no channel it may decide through"
            return (
                f"{principal.name!r} may not decide request {request.id} through {through}:"
                f" queue {request.queue} is decided through {', '.join(channels) or 'nothing'}"
            )
        return None

    def check_may_decide(
        self, principal: Principal, request: Request, via: Collection[str]
    ) -> None:
        self.check_channels(principal, via)
        problem = self.refusal(principal, request, via)
        if problem:
            raise Forbidden(problem)

    def check_channels(self, principal: Principal, via: Collection[str]) -> None:
        """Refuse a reply through a notify-only channel (a webhook endpoint with `decides =
        false`) before anything is read: it decides nothing, whatever the request."""
        refused = [c for c in via if not self.config.decides_through(c)]
        if refused:
            raise Forbidden(
                f"{principal.name!r} may not decide: {refused[0]} is notify-only (its endpoint"
                " has decides = false)"
            )

    # ---- what can apply --------------------------------------------------------------------

    def chain(self, queue: str) -> list[str]:
        """The queues a request in `queue` may be escalated to by hand: its `escalate_to`, that
        queue's, and so on (the config refuses loops)."""
        out: list[str] = []
        nxt = self.config.escalation_target(queue)
        while nxt is not None and nxt not in out:
            out.append(nxt)
            nxt = self.config.escalation_target(nxt)
        return out

    def check_chain(self, principal: Principal, request: Request, target: str) -> None:
        """A person escalates only along the chain; the admin and the shell (every role) may
        send a request anywhere, back to an earlier queue too."""
        if EVERY_ROLE in principal.roles:
            return
        chain = self.chain(request.queue)
        if target not in chain:
            along = " -> ".join([request.queue, *chain]) if chain else f"{request.queue} (none)"
            raise Forbidden(
                f"{principal.name!r} may escalate request {request.id} only along its queue's"
                f" escalate_to chain ({along}), not to {target!r}"
            )

    def check_applies(self, decision: Decision, request: Request) -> Decision:
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
        target = decision.target or self.config.escalation_target(request.queue)
        if target is None:
            raise InvalidInput(
                f"queue {request.queue!r} has no escalate_to; name a target queue",
                code="no_target",
            )
        if target not in self.config.queues:
            known = ", ".join(sorted(self.config.queues))
            raise InvalidInput(
                f"queue {target!r} is not defined (known: {known})", code="unknown_queue"
            )
        if target == request.queue:
            raise InvalidInput(
                f"request {request.id} is already in queue {target!r}", code="same_queue"
            )
        return decision.model_copy(update={"target": target})

    # ---- deciding --------------------------------------------------------------------------

    def decide(
        self,
        request_id: str,
        decision: Decision,
        principal: Principal,
        *,
        via: Collection[str],
        decided_by: str | None = None,
        current: Request | None = None,
        once: Once | None = None,
    ) -> Decided:
        """Decide `request_id` for `principal`, replying through the channels `via`.

        Raises NotFound, Forbidden (roles, a channel outside the request's queue, or an
        escalation off its queue's chain), InvalidInput (`invalid_args`: `modified` args that
        don't meet the tool's schema), or Conflict when someone else (or another decision)
        won, the request was escalated meanwhile (code `escalated`: checked by queue and by
        escalation count, so a move away and back still counts), or `once` was already spent
        (code `replayed`). The same principal repeating its decision or its escalation gets
        the request back instead, with nothing recorded. `once` is spent only with a decision.
        """
        decided_by = printable(decided_by or principal.name)
        voter = voter_of(self.config, decided_by)  # one person, whatever the channel
        self.check_channels(principal, via)
        current = current or self.broker.get_request(request_id)
        if decision.outcome is Outcome.escalated and repeated_escalation(
            current, decision, decided_by
        ):
            return Decided(current, recorded=False)
        self.check_may_decide(principal, current, via)
        self.check_not_creator(principal, current, decision, decided_by)
        if current.is_pending and repeated_vote(current, decision, voter):
            return Decided(current, recorded=False)  # the step would say 'repeat' too
        if current.is_pending:
            decision = self.check_applies(decision, current)
            if decision.target is not None:
                self.check_chain(principal, current, decision.target)
        if decision.outcome is Outcome.answered:  # InvalidAnswer (422) before it can count
            decision = decision.model_copy(
                update={"answer": validate_answer(current.metadata, decision.answer)}
            )
        # else the atomic step answers: replayed marker, or who won (maybe this very decision)
        try:
            request = self.broker.decide(
                current.id,
                decision,
                decided_by=decided_by,
                voter=voter,
                in_queue=current.queue,
                in_escalation=current.escalations,
                once=once,
                channel=self.channel_of(current, via),
                creator_may_vote=EVERY_ROLE in principal.roles,
                request=current,
            )
        except Conflict as exc:
            if exc.code == "conflict" and (
                same_decision(exc.request.decision, decision, decided_by)
                or repeated_vote(exc.request, decision, voter)
            ):
                return Decided(exc.request, recorded=False)
            raise
        except InvalidInput as exc:
            if exc.code != "same_queue":
                raise
            # escalated to the same target by someone else between our read and the step
            moved = self.broker.get_request(current.id)
            raise Conflict(
                f"request {current.id} was escalated to {moved.queue}",
                request=moved,
                code="escalated",
            ) from None
        return Decided(request, recorded=True)

    # ---- the two-person rule and "I'm on it" -----------------------------------------------

    def check_not_creator(
        self, principal: Principal, request: Request, decision: Decision, decided_by: str
    ) -> None:
        """The one who asked for the call never approves it, through any channel and under
        any spelling of their name (`broker.domain.persons`); the step refuses the creator's vote too.

        The admin token and the shell are exempt: they could write Redis anyway.
        """
        if (
            is_approval(decision)
            and request.created_by
            and same_person(self.config, request.created_by, decided_by)
            and EVERY_ROLE not in principal.roles
        ):
            raise Forbidden(
                f"{decided_by!r} asked for request {request.id} and may not approve it: the"
                " one who asks never counts as an approver",
                code="creator_may_not_approve",
            )

    def channel_of(self, request: Request, via: Collection[str]) -> str:
        """The channel a reply came through, as a vote records it (the shell: `shell`)."""
        queue = self.config.queues.get(request.queue)
        channels = queue.channels if queue else []
        matched = [c for c in via if c in channels]
        return (matched or list(via) or ["shell"])[0]

    def ack(
        self,
        request_id: str,
        principal: Principal,
        *,
        via: Collection[str],
        by: str | None = None,
    ) -> Request:
        """ "I'm on it" from someone who may decide the request: it stays pending and its
        escalation waits for the queue's `ack_timeout_s`. Never a vote, never an outcome.

        Raises NotFound, Forbidden (as for deciding) or Conflict (decided or timed out, with
        the request; code `escalated` when it moved meanwhile).
        """
        current = self.broker.get_request(request_id)
        self.check_may_decide(principal, current, via)
        return Acks(self.broker.store).ack(
            current.id,
            by=printable(by or principal.name),
            in_queue=current.queue,
            channel=self.channel_of(current, via),
        )
