"""The two-person rule: how many approvals a request needs, and who counts as a person.

A request's `quorum` is fixed when it is created: its queue's `quorum` (default 1), or more if
the request asks (`quorum` in `POST /v1/requests`, or in a tool's metadata), never fewer. The
votes themselves are counted inside the atomic decide step (decide.lua), never here.

**A person** is the name a reply is recorded under (`decided_by`): the approver's name for a
bearer token, a Slack user (by `slack_user_id`) and an email address an approver has, so one
approver counts once whatever channels they use; `email:ADDRESS` for an address no approver
has; for a webhook reply, the approver its `decided_by` names (by name, address or chat user
id), else the endpoint itself, `webhook:NAME` (`broker.domain.persons.voter_of`); the operator's
`--by` name at the shell.
"""

from __future__ import annotations

from collections.abc import Collection

from broker.domain.args_hash import args_hash
from broker.domain.config import Config
from broker.domain.errors import InvalidInput
from broker.domain.models import MAX_QUORUM, Decision, NewRequest, Outcome, Request, Vote

POLICY = "policy"


def asked_quorum(new: NewRequest) -> int | None:
    """The quorum a request asks for: its own field, else its (tool's) metadata `quorum`."""
    if new.quorum is not None:
        return new.quorum
    raw = new.metadata.get("quorum")
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= MAX_QUORUM:
        raise InvalidInput(
            f"metadata.quorum must be a whole number from 1 to {MAX_QUORUM}, got {raw!r}",
            code="invalid_quorum",
        )
    return raw


def quorum_of(new: NewRequest, config: Config) -> int:
    """The approvals a new request needs; a request asking for fewer than its queue is refused."""
    floor = config.quorum_for(new.queue)
    asked = asked_quorum(new)
    if asked is None:
        return floor
    if asked < floor:
        raise InvalidInput(
            f"quorum {asked} is below queue {new.queue!r}'s quorum of {floor}: a request may"
            " ask for more approvals than its queue, never fewer",
            code="quorum_below_queue",
        )
    return asked


def creation_fields(new: NewRequest, config: Config) -> dict[str, str]:
    """The hash fields of the two-person rule that a new request starts with."""
    return {
        "quorum": str(quorum_of(new, config)),
        "approvals": "[]",
        "created_by": new.created_by or "",
    }


def vote_hash(request: Request, decision: Decision) -> str:
    """The args an approval is for: the request's own, or a `modified` decision's new ones."""
    if decision.outcome is Outcome.modified and decision.args is not None:
        return args_hash(decision.args)
    return request.args_hash


def is_approval(decision: Decision) -> bool:
    return decision.outcome in (Outcome.approved, Outcome.modified)


def voted(request: Request, by: str, hash_: str) -> Vote | None:
    """`by`'s recorded approval of the args `hash_`, if any."""
    return next((v for v in request.approvals if v.by == by and v.args_hash == hash_), None)


def repeated_vote(request: Request, decision: Decision, by: str) -> bool:
    """Is this approval one `by` already gave (a harmless repeat, not a second vote)?

    Also after the request was decided: the approval that helped approve it, sent again.
    """
    if not is_approval(decision) or request.quorum <= 1:
        return False
    hash_ = vote_hash(request, decision)
    if voted(request, by, hash_) is None:
        return False
    if request.is_pending:
        return True
    outcome = request.decision.outcome if request.decision else None
    approved = outcome in (Outcome.approved, Outcome.modified)
    decided_hash = (
        args_hash(request.decision.args)
        if request.decision and request.decision.args is not None
        else request.args_hash
    )
    return approved and decided_hash == hash_


def rule_may_decide(request: Request, rule_creator_roles: Collection[str], bypass: bool) -> bool:
    """Hook for policy rules (another issue): a rule never decides a request needing more than
    one approval, unless a principal with role `policy` created it and it says
    `quorum_bypass = true`. Such a rule then decides with `Decisions.decide(...,
    bypass_quorum=True)`; any other rule must leave the request to people."""
    if request.quorum <= 1:
        return True
    return bypass and POLICY in rule_creator_roles
