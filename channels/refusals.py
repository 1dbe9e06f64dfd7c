"""What a chat clicker reads when a click is refused: the one place where a broker error becomes
the words Slack, Telegram, Discord and Teams show.

Anyone in a chat can click a card's button, and anyone who can reach a chat endpoint can name a
request id. The judge's own refusals (`broker.judge.deciding`) name the request, its queue, the
queue's roles and its whole channel list: right for REST's 403, which only a caller who may see
the request gets (the others get 404), not for a click. So a refusal here says what kind of
refusal it is and nothing of the request. A late click still names who decided first: only a
clicker who may decide the request gets that far (the judge checks who may decide first), and
for them the card shows the outcome anyway. Text from the clicker's own input (the account id
it sent) is shown on one line and clipped.
"""

from __future__ import annotations

from broker.domain.errors import BrokerError, Conflict, Forbidden, NotFound
from broker.domain.principals import NotAnApprover
from broker.domain.printable import one_line

MAX_TEXT = 190
"""Telegram's callback answer holds 200 characters; every chat's refusal fits it."""

CREATOR = "creator_may_not_approve"
ESCALATION_REFUSALS = frozenset({"no_target", "unknown_queue", "same_queue"})
"""The judge's codes for an escalation that can't go anywhere (its text names queues)."""


def refusal_text(exc: BrokerError) -> str:
    """The line a refused click shows its clicker."""
    if isinstance(exc, Conflict):
        return _too_late(exc)
    if isinstance(exc, NotAnApprover):
        return one_line(exc.detail)[:MAX_TEXT]
    if isinstance(exc, Forbidden):
        if exc.code == CREATOR:
            return "You asked for this request, so you may not approve it."
        return "You may not decide this request from here."
    if isinstance(exc, NotFound):
        return "This request no longer exists."
    if exc.code in ESCALATION_REFUSALS:
        return "This request can't be escalated from here."
    return one_line(exc.detail)[:MAX_TEXT]  # the clicker's own input refused: what to fix


def _too_late(exc: Conflict) -> str:
    if exc.code == "replayed":
        return "This click was already received."
    request = exc.request
    if exc.code == "escalated" or request.is_pending:
        return "Too late: this request was escalated."
    decision = request.decision
    who = f" by {one_line(decision.decided_by)}" if decision and decision.decided_by else ""
    return f"Too late: this request was already {request.status.value}{who}."[:MAX_TEXT]
