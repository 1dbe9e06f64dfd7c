"""The judge's checks are pure: `plan` turns (request, decision, decider, via, config) into the
step to run or an early answer, with no Redis at all, and `repeat_of` reads a lost race."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from broker.domain.config import parse_config
from broker.domain.errors import Conflict, Forbidden, InvalidInput
from broker.domain.models import Decision, HistoryEntry, Outcome, Request, Status, utcnow
from broker.domain.principals import Principal, operator
from broker.judge.deciding import Decided, plan, repeat_of
from broker.store.decide_step import Step

CONFIG = parse_config(
    {
        "queues": {
            "default": {"channels": ["inbox", "webhook:ops"], "escalate_to": "managers"},
            "managers": {"channels": ["inbox"], "roles": ["lead"]},
            "pair": {"channels": ["inbox"], "quorum": 2},
        },
        "webhooks": {
            "ops": {"url": "http://127.0.0.1:9/", "secret": "whsec_" + "QUJD" * 8, "roles": ["ops"]}
        },
        "approvers": {
            "alice": {"roles": ["ops"]},
            "bob": {"roles": ["ops"]},
            "lee": {"roles": ["ops", "lead"]},
        },
    }
)
ALICE = Principal("alice", frozenset({"ops"}))
LEAD = Principal("lee", frozenset({"ops", "lead"}))


def request(**fields: Any) -> Request:
    now = utcnow()
    base = {
        "id": "req_1",
        "tool_call_id": "c1",
        "tool_name": "refund",
        "args_hash": "h" * 64,
        "created_at": now,
        "expires_at": now + timedelta(minutes=10),
    }
    return Request.model_validate({**base, **fields})


def test_a_decision_becomes_the_step_bound_to_what_was_read() -> None:
    read = request(escalations=2)
    step = plan(
        read, Decision(outcome=Outcome.approved), ALICE, ["inbox"], CONFIG, decided_by="alice"
    )
    assert isinstance(step, Step)
    assert (step.request_id, step.decided_by, step.voter) == ("req_1", "alice", "alice")
    assert (step.in_queue, step.in_escalation, step.channel) == ("default", 2, "inbox")
    assert step.request is read and not step.creator_may_vote


def test_a_webhook_person_votes_as_the_approver_it_names_and_the_shell_as_itself() -> None:
    endpoint = Principal("webhook:ops", frozenset({"ops"}))
    step = plan(
        request(),
        Decision(outcome=Outcome.approved),
        endpoint,
        ["webhook:ops"],
        CONFIG,
        decided_by="webhook:ops/bob",
    )
    assert isinstance(step, Step) and step.voter == "bob" and step.channel == "webhook:ops"
    shell = plan(
        request(),
        Decision(outcome=Outcome.approved),
        operator("root"),
        [],
        CONFIG,
        decided_by="root",
    )
    assert isinstance(shell, Step) and shell.creator_may_vote and shell.channel == "shell"


def test_an_escalation_gets_its_target_and_a_repeat_is_answered_early() -> None:
    step = plan(
        request(), Decision(outcome=Outcome.escalated), ALICE, ["inbox"], CONFIG, decided_by="alice"
    )
    assert isinstance(step, Step) and step.decision.target == "managers"
    just_now = HistoryEntry(at=utcnow(), event="escalated", by="alice", to_queue="managers")
    moved = request(queue="managers", history=[just_now], escalations=1)
    again = plan(
        moved, Decision(outcome=Outcome.escalated), ALICE, ["inbox"], CONFIG, decided_by="alice"
    )
    assert again == Decided(moved, recorded=False)


def test_a_repeated_vote_is_answered_early() -> None:
    voted = request(
        queue="pair",
        quorum=2,
        approvals=[{"by": "alice", "at": utcnow().isoformat(), "args_hash": "h" * 64}],
    )
    early = plan(
        voted, Decision(outcome=Outcome.approved), ALICE, ["inbox"], CONFIG, decided_by="alice"
    )
    assert early == Decided(voted, recorded=False)


@pytest.mark.parametrize(
    ("read", "decision", "decider", "via", "error", "code"),
    [
        (request(), Decision(outcome=Outcome.approved), ALICE, ["slack:x"], Forbidden, "forbidden"),
        (request(queue="managers"), Decision(outcome=Outcome.approved), ALICE, ["inbox"], Forbidden, "forbidden"),
        (request(created_by="alice"), Decision(outcome=Outcome.approved), ALICE, ["inbox"], Forbidden, "creator_may_not_approve"),
        (request(kind="question"), Decision(outcome=Outcome.approved), ALICE, ["inbox"], InvalidInput, "wrong_kind"),
        (request(), Decision(outcome=Outcome.approved, args_hash="0" * 64), ALICE, ["inbox"], InvalidInput, "stale_args"),
        (request(), Decision(outcome=Outcome.escalated, target="pair"), ALICE, ["inbox"], Forbidden, "forbidden"),
        (request(status="approved"), Decision(outcome=Outcome.escalated), LEAD, ["inbox"], Conflict, "conflict"),
    ],
    ids=["channel", "queue roles", "creator", "kind", "stale args", "off the chain", "done"],
)  # fmt: skip
def test_what_may_not_apply_is_refused_before_any_step(
    read: Request, decision: Decision, decider: Principal, via: list[str], error: type, code: str
) -> None:
    with pytest.raises(error) as caught:
        plan(read, decision, decider, via, CONFIG, decided_by=decider.name)
    assert caught.value.code == code


def test_a_lost_race_is_a_repeat_only_when_it_is_this_very_decision() -> None:
    step = plan(
        request(),
        Decision(outcome=Outcome.rejected, reason="no"),
        ALICE,
        ["inbox"],
        CONFIG,
        decided_by="alice",
    )
    assert isinstance(step, Step)
    mine = Decision(outcome=Outcome.rejected, reason="no", decided_by="alice")
    theirs = Decision(outcome=Outcome.rejected, reason="no", decided_by="bob")
    won = request(status=Status.rejected, decision=mine)
    lost = request(status=Status.rejected, decision=theirs)
    assert repeat_of(Conflict("x", request=won, code="conflict"), step)
    assert not repeat_of(Conflict("x", request=lost, code="conflict"), step)
    assert not repeat_of(Conflict("x", request=won, code="replayed"), step)
