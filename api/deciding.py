"""Recording a decision from any channel: roles, idempotent repeats, metrics.

Every reply path (REST, Slack, email, webhooks) ends here, so `allowed_roles` is enforced the
same way everywhere and the first decision wins through the broker's one atomic step.
"""

from __future__ import annotations

from datetime import timedelta

from api.state import ApiState
from broker.auth import Principal
from broker.client import Once
from broker.errors import Conflict, Forbidden, InvalidInput
from broker.models import Decision, Outcome, Request, utcnow

# A second escalation by the same person this soon after their first is a repeat (double click,
# retry), not a request to escalate one queue further.
REPEAT_ESCALATION_WINDOW = timedelta(minutes=5)


def check_may_decide(principal: Principal, request: Request) -> None:
    if not principal.may_decide(request):
        needs = (
            f"one of the roles {', '.join(request.allowed_roles)}"
            if request.allowed_roles
            else "an approver's role ('requester' alone only asks)"
        )
        raise Forbidden(f"{principal.name!r} may not decide request {request.id}: it needs {needs}")


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


def _repeated_escalation(request: Request, decision: Decision, decided_by: str) -> bool:
    """Was the request's latest escalation this person's, just now, to this target?

    Deliveries are recorded in the history too, so look for the latest escalation, not the
    latest entry.
    """
    last = next((h for h in reversed(request.history) if h.event == "escalated"), None)
    return last is not None and (
        last.event == "escalated"
        and last.by == decided_by
        and (decision.target is None or decision.target == last.to_queue)
        and utcnow() - last.at < REPEAT_ESCALATION_WINDOW
    )


def decide_as(
    state: ApiState,
    request_id: str,
    decision: Decision,
    principal: Principal,
    *,
    channel: str,
    decided_by: str | None = None,
    current: Request | None = None,
    in_queue: str | None = None,
    once: Once | None = None,
) -> Request:
    """Decide `request_id` for `principal`; returns the request as recorded.

    Raises NotFound, Forbidden (role), InvalidInput, or Conflict when someone else (or another
    decision) won. The same principal repeating its decision gets the request back instead.
    """
    decided_by = decided_by or principal.name
    if decision.outcome is Outcome.timed_out:
        raise InvalidInput(
            "'timed_out' is recorded by the sweeper; it can't be given as a decision"
        )
    current = current or state.broker.get_request(request_id)
    check_may_decide(principal, current)
    if decision.outcome is Outcome.escalated and _repeated_escalation(
        current, decision, decided_by
    ):
        return current
    try:
        request = state.broker.decide(
            request_id, decision, decided_by=decided_by, in_queue=in_queue, once=once
        )
    except Conflict as exc:
        if exc.code == "conflict" and same_decision(exc.request.decision, decision, decided_by):
            return exc.request  # type: ignore[no-any-return]
        raise
    if decision.outcome is not Outcome.escalated:
        state.metrics.observe_decision(request, channel)
    return request
