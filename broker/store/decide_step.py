"""One decision's atomic step without I/O: the script call to make, and what its reply means.

`Step` is what the judge settled (or what a system decides: `Broker.decide`): the decision,
the recorded name, and the conditions the step checks atomically. `StepCall` turns it into
decide.lua's or escalate.lua's keys and argument once, and reads each reply: the request as
recorded, the error the reply means, or the next call when the step asked for a key it was not
given (`need_stream`, `need_run`) or named other voters than the receipt (`need_votes`).
`broker.store.decisions.Decisions` runs it sync or async, as httpx's two clients share
`BaseClient`: one way to build the call and read the reply, two ways to send it.

It never decides who may decide or what can apply (the judge's, `broker.judge`): it says
how a decision is written, and reads what the step answered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from broker.audit.actors import actor_args
from broker.domain.args_hash import args_hash
from broker.domain.errors import Conflict, Forbidden, InvalidInput, NotFound
from broker.domain.ids import run_of_request
from broker.domain.models import Decision, Outcome, Request, Status
from broker.domain.receipts import RECEIPT_OUTCOMES, call_facts
from broker.store.handles import Store
from broker.store.request_hash import parse_flat
from broker.store.script_keys import ScriptKeys
from broker.tracing import spans as traced
from broker.tracing import telemetry as tracing

Once = tuple[str, int]
"""A one-time marker: its Redis key (see `Keys.seen`) and how long it is kept, in seconds."""

OUTCOME_STATUS = {
    Outcome.approved: Status.approved,
    Outcome.modified: Status.modified,
    Outcome.rejected: Status.rejected,
    Outcome.answered: Status.answered,
}
_CONFLICTS = {
    "conflict": ("conflict", "request {id} is already {status}"),
    "replayed": ("replayed", "this reply was already received; request {id} is {status}"),
    "moved": ("escalated", "request {id} was escalated to {queue}"),
}
_TRIES = 10
"""Calls of one step at most: the first, plus one per key it turned out to need and one per
new set of voters (see `StepCall.answer`)."""


@dataclass(frozen=True)
class Resume:
    """A round the step completed and claimed for its resume job, for a caller that enqueues
    that job itself (`StepCall(claimant=...)`): the run, the round, the outbox entry the step
    wrote (in `stream`) and the trace the resume goes on in."""

    run_id: str
    round: int
    entry_id: str
    stream: str
    traceparent: str | None = None


@dataclass(frozen=True)
class Step:
    """One decision to record, as settled before the step: by whom, and on what conditions.

    `decided_by` is the name recorded; `voter` the person it counts as for one vote each and
    the creator rule (`broker.domain.persons.voter_of`; default `decided_by`). With
    `in_queue` / `in_escalation` the step applies only while the request waits in that queue
    after that many escalations (else `Conflict` code `escalated`); with `once` (a marker key
    and its lifetime) the marker is checked and spent in the same step (a spent one is
    `Conflict` code `replayed`). `channel` is the channel a vote records; `creator_may_vote`
    lets the admin and the shell approve what they asked for; `bypass_quorum` is only for a
    policy rule that may (`broker.domain.quorum.rule_may_decide`). `request` is the request
    as the caller read it: a receipt's facts never change, so it saves a read.
    """

    request_id: str
    decision: Decision
    decided_by: str
    voter: str | None = None
    in_queue: str | None = None
    in_escalation: int | None = None
    once: Once | None = None
    channel: str | None = None
    creator_may_vote: bool = False
    bypass_quorum: bool = False
    request: Request | None = None

    @property
    def escalating(self) -> bool:
        return self.decision.outcome is Outcome.escalated

    def needs_read(self, store: Store) -> bool:
        """Must the request be read before the call: an escalation to its queue's default
        target, or a receipt to sign without the caller's read."""
        if self.escalating:
            return self.decision.target is None
        return (
            self.request is None
            and store.receipts is not None
            and self.decision.outcome in RECEIPT_OUTCOMES
        )

    def with_read(self, store: Store, current: Request) -> Step:
        """This step once the request is read: an escalation gets its queue's default target
        (`Conflict` if it is no longer pending, `InvalidInput` `no_target` if it has none)."""
        if not self.escalating or self.decision.target is not None:
            return replace(self, request=current)
        if not current.is_pending:
            raise Conflict(
                f"request {self.request_id} is already {current.status.value}", request=current
            )
        target = store.config.escalation_target(current.queue)
        if target is None:
            raise InvalidInput(
                f"queue {current.queue!r} has no escalate_to; name a target queue",
                code="no_target",
            )
        return replace(self, decision=self.decision.model_copy(update={"target": target}))


def _votes_with(request: Request, decision: Decision, voter: str) -> list[str]:
    """Who will have approved these args once `voter`'s vote counts, as decide.lua orders them:
    the earlier voters for the same args, then `voter` (the receipt's `quorum.votes`)."""
    hash_ = args_hash(decision.args) if decision.args is not None else request.args_hash
    earlier = [v.by for v in request.approvals if v.args_hash == hash_ and v.by != voter]
    return [*earlier, voter]


class StepCall:
    """The script calls of one `Step` and the meaning of their replies (no I/O).

    `script()` is the call to make (name, keys, argument values); `answer(reply)` is the
    request as recorded, raises the error the reply means, or is None: call `script()` again.

    With a `claimant`, the caller enqueues the resume job of the round this step completes
    itself: the step writes the round's outbox entry to `resumes_direct` (the resumers take it
    from there only after a grace) and claims the round for `claimant`; `resume` is then that
    round (None when the step completed no round, or a live job waits for it).
    """

    def __init__(self, store: Store, step: Step, claimant: str | None = None) -> None:
        self.store = store
        self.step = step
        self.claimant = None if step.escalating else claimant
        self.resume: Resume | None = None
        self.decision = step.decision.model_copy(update={"receipt": None})  # only the broker's
        self.run_id: str | None = None
        self.extra: list[str] = []
        self.tries = 0
        self.started = tracing.now_ns()
        if step.escalating:
            if step.decision.target is None:
                raise ValueError("an escalation's step needs its target (`Step.with_read`)")
            store.check_queue(step.decision.target)
            self.values = self._escalate_values()
            return
        if self.decision.outcome not in OUTCOME_STATUS:
            raise InvalidInput(
                f"outcome {self.decision.outcome.value!r} can't be given as a decision"
            )
        self.run_id = run_of_request(step.request_id)  # escalating ends no round
        self.voter = step.voter or step.decided_by
        self.votes: list[str] | None = None
        receipts = store.receipts
        if receipts is not None and self.decision.outcome in RECEIPT_OUTCOMES:
            if step.request is None:
                raise ValueError("a receipt's step needs the request read (`Step.with_read`)")
            if not step.bypass_quorum:
                self.votes = _votes_with(step.request, self.decision, self.voter)
        self.quorum = step.request.quorum if step.request is not None else 1
        self.values = self._decide_values()

    def _decide_values(self) -> dict[str, Any]:
        """decide.lua's argument values for the decision, signed for `self.votes`."""
        step, decision = self.step, self.decision
        stamped = decision
        receipts = self.store.receipts
        if receipts is not None and step.request is not None:
            stamped = receipts.stamp(
                call_facts(step.request),
                decision,
                decided_by=step.decided_by,
                votes=self.votes,
                quorum=self.quorum,
            )
        # decided_at is left out: the step sets it, on Redis's clock
        recorded = stamped.model_copy(update={"decided_by": step.decided_by, "decided_at": None})
        return {
            "outcome": decision.outcome.value,
            "status": OUTCOME_STATUS[decision.outcome].value,
            "decision": json.dumps(recorded.public(), separators=(",", ":"), ensure_ascii=False),
            "args_hash": decision.args_hash or None,
            "retention": self.store.retention,
            "vote_hash": args_hash(decision.args) if decision.args is not None else None,
            "channel": step.channel or None,
            "creator_may_vote": step.creator_may_vote or None,
            **actor_args(step.decided_by),
            "voter": self.voter,
            "in_queue": step.in_queue or None,
            "in_escalation": step.in_escalation,
            "bypass_quorum": step.bypass_quorum or None,
            "receipt_votes": self.votes if self.quorum > 1 else None,
        }

    def _escalate_values(self) -> dict[str, Any]:
        """escalate.lua's argument values: `at` and `from_queue` of the history entry are
        added by the step, which knows both."""
        step, config = self.step, self.store.config
        target = str(step.decision.target)
        entry = {
            "event": "escalated",
            "by": step.decided_by,
            "to_queue": target,
            "reason": step.decision.reason,
        }
        return {
            "target": target,
            "timeout_s": config.timeout_for(target),
            "quorum": config.quorum_for(target),
            "entry": json.dumps({k: v for k, v in entry.items() if v is not None}),
            "args_hash": step.decision.args_hash or None,
            "in_queue": step.in_queue or None,
            "in_escalation": step.in_escalation,
            **actor_args(step.decided_by),
        }

    def script(self) -> tuple[str, ScriptKeys, dict[str, Any]]:
        """The call to make: which script, its KEYS, its argument values.

        Which keys a step touches depends on stored fields: the streams of the queue the
        request waits in (and moves to), and its run's keys. We pass the streams of every
        configured queue and the run the request id names (`broker.domain.ids`), without a
        read. The step checks, atomically and before writing anything, that what it is about
        to write is among them; if not (a request left in a queue since dropped from the
        config, an id not in the round format), it writes nothing and asks for the key, and
        the next call has it too. Fields can change between two calls, but each call judges
        them afresh inside its own atomic step, so the retry is as safe as the first try.
        """
        step, store = self.step, self.store
        once_key, once_ttl = step.once if step.once else (None, None)
        keys = store.keys.decide_keys(
            step.request_id, self.run_id, [*store.config.queues, *self.extra], once_key
        )
        values = {k: v for k, v in self.values.items() if v is not None}  # JSON null is truthy
        args: dict[str, Any] = {"id": step.request_id, "maxlen": store.maxlen, **values}
        if self.claimant:
            keys.name("resumes", self._direct_outbox(keys.partition))
            args["claimant"] = self.claimant
        if self.run_id:
            args["run_id"] = self.run_id
        if once_key:
            args["once_ttl"] = once_ttl
        return ("escalate" if step.escalating else "decide"), keys, args

    def answer(self, reply: list[Any]) -> Request | None:
        """The request the step recorded (or a vote, or a repeat), the error its reply means,
        or None: it asked for another call (`script()` has what it asked for)."""
        self.tries += 1
        code = reply[0]
        if code in ("need_stream", "need_run", "need_votes"):
            if self.tries >= _TRIES:
                raise RuntimeError(f"step on {self.step.request_id} kept asking: {reply!r}")
            if code == "need_stream":
                self.extra.append(reply[1])
            elif code == "need_run":
                self.run_id = reply[1]
            else:  # the quorum's last vote, with other voters than we read: sign for those
                self.votes = json.loads(reply[1])
                self.values = self._decide_values()
            return None
        step = self.step
        recorded = outcome_of(reply, step.request_id, None if step.escalating else self.decision)
        if code == "ok" and self.claimant and self.run_id and reply[1]:
            entry_id, round_no = str(reply[1]).split(" ")
            fields = dict(zip(reply[2::2], reply[3::2], strict=False))
            self.resume = Resume(
                self.run_id,
                int(round_no),
                entry_id,
                self._direct_outbox(self.store.keys.partition_of_request(step.request_id)),
                fields.get("traceparent") or None,
            )
        if self.started and step.escalating and code == "ok":  # spans in the request's trace
            traced.escalation(
                reply[2:],
                recorded,
                step.decided_by,
                from_queue=str(reply[1]),
                started_ns=self.started,
            )
        elif self.started and not step.escalating and code != "repeat":
            outcome = traced.outcome_of(self.decision, code)
            traced.decision(
                reply[2:], recorded, outcome, step.decided_by, step.channel, self.started
            )
        return recorded

    def _direct_outbox(self, partition: int) -> str:
        return self.store.keys.part(partition).resumes_direct


def stale_args(request_id: str) -> InvalidInput:
    """The one text of a decision made on other args than the request's (judge and step)."""
    return InvalidInput(
        f"args_hash does not match request {request_id}'s args: the decision was made on"
        " other args",
        code="stale_args",
    )


def wrong_kind(outcome: str, kind: str) -> InvalidInput:
    """The one text of an outcome that can't apply to a request's kind (judge and step)."""
    return InvalidInput(
        f"outcome {outcome!r} does not apply to a request of kind {kind!r}", code="wrong_kind"
    )


def outcome_of(reply: list[Any], request_id: str, decision: Decision | None) -> Request:
    """The request a step replied with, or the error its code means."""
    code, detail, fields = reply[0], reply[1], reply[2:]
    if code in ("ok", "voted", "repeat"):
        return parse_flat(fields)
    if code == "creator":
        raise Forbidden(
            f"request {request_id} was asked for by {parse_flat(fields).created_by!r}, who"
            " may not approve it: the one who asks never counts as an approver",
            code="creator_may_not_approve",
        )
    if code == "not_found":
        raise NotFound(f"no request with id {request_id!r}")
    if code in _CONFLICTS:
        current = parse_flat(fields)
        conflict_code, message = _CONFLICTS[code]
        text = message.format(id=request_id, status=current.status.value, queue=current.queue)
        raise Conflict(text, request=current, code=conflict_code)
    if code == "stale_args":
        raise stale_args(request_id)
    if code == "wrong_kind":
        raise wrong_kind(decision.outcome.value if decision else "?", detail)
    if code == "same_queue":
        current = parse_flat(fields)
        raise InvalidInput(
            f"request {request_id} is already in queue {current.queue!r}", code="same_queue"
        )
    raise RuntimeError(f"unexpected script result {reply!r}")
