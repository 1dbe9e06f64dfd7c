"""Decisions: recording a person's (or a system's) outcome, or moving a request to another queue.

Each is one Lua step (decide.lua, escalate.lua): the first decision wins, a one-time marker is
spent with it, and the last answered call of a round writes its run's resume to the outbox in
the same step. The step replies with the request as stored, so there is no read around it.
Who may decide, and what a channel's reply means, is decided before this (api/, deciding).
"""

from __future__ import annotations

import json
from typing import Any

from broker.audit.actors import actor_args
from broker.domain.args_hash import args_hash
from broker.domain.errors import Conflict, Forbidden, InvalidInput, NotFound
from broker.domain.ids import run_of_request
from broker.domain.models import Decision, Outcome, Request, Status
from broker.domain.receipts import RECEIPT_OUTCOMES, call_facts
from broker.store.handles import Store
from broker.store.request_hash import parse_flat
from broker.store.requests import Requests
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
_TRIES = 5
"""Calls of one step at most: the first, plus one per key it turned out to need (see `_step`)."""


def _votes_with(request: Request, decision: Decision, voter: str) -> list[str]:
    """Who will have approved these args once `voter`'s vote counts, as decide.lua orders them:
    the earlier voters for the same args, then `voter` (the receipt's `quorum.votes`)."""
    hash_ = args_hash(decision.args) if decision.args is not None else request.args_hash
    earlier = [v.by for v in request.approvals if v.args_hash == hash_ and v.by != voter]
    return [*earlier, voter]


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


class Decisions:
    def __init__(self, store: Store, requests: Requests) -> None:
        self.store = store
        self.requests = requests

    def decide(
        self,
        request_id: str,
        decision: Decision,
        *,
        decided_by: str,
        voter: str | None = None,
        in_queue: str | None = None,
        once: Once | None = None,
        in_escalation: int | None = None,
        channel: str | None = None,
        creator_may_vote: bool = False,
        bypass_quorum: bool = False,
        request: Request | None = None,
    ) -> Request:
        """Record a decision; the first one wins.

        Raises `Conflict` (carrying the request as it stands) when it was already decided or timed
        out, `InvalidInput` for a decision that can never apply, `NotFound` for an unknown id.
        With `in_queue`, the decision only applies while the request waits in that queue (a
        link mailed to one queue's people); otherwise `Conflict` with code `escalated`. With
        `in_escalation`, only while it has been escalated that many times (a link minted then:
        after a round trip back to the same queue it is still refused), the same way.
        With `once` (a marker key and its lifetime: a webhook-id, an email link), the marker is
        checked and spent in the same atomic step; a spent one is `Conflict` code `replayed`.

        An approval of a request whose `quorum` is above 1 is the vote of `voter` (the person
        `decided_by` is, as `broker.domain.persons.voter_of` says; default `decided_by`): the request
        stays pending until the quorum-th person approves the same args. The request's creator may
        not approve (`Forbidden`, code `creator_may_not_approve`) unless `creator_may_vote`
        (the admin, the shell). `bypass_quorum` is only for a policy rule that may (see
        `broker.domain.quorum.rule_may_decide`). A repeated vote writes nothing and gets the request.

        With `[receipts]` on, an outcome that lets something run is stored with its receipt
        (`broker.domain.receipts`), signed here just before the step; `request` (the request as the
        caller read it) saves a read of the facts the receipt binds, which never change.
        """
        if decision.outcome is Outcome.escalated:
            return self.escalate(
                request_id,
                decision.target,
                reason=decision.reason,
                by=decided_by,
                args_hash=decision.args_hash,
                in_queue=in_queue,
                in_escalation=in_escalation,
                once=once,
            )
        if decision.outcome not in OUTCOME_STATUS:
            raise InvalidInput(f"outcome {decision.outcome.value!r} can't be given as a decision")
        decision = decision.model_copy(update={"receipt": None})  # only ever the broker's
        voter = voter or decided_by
        receipts = self.store.receipts
        votes: list[str] | None = None
        if receipts is not None and decision.outcome in RECEIPT_OUTCOMES:
            request = request or self.requests.get_request(request_id)
            votes = None if bypass_quorum else _votes_with(request, decision, voter)
        quorum = request.quorum if request is not None else 1
        started = tracing.now_ns()
        for _ in range(_TRIES):
            stamped = decision
            if receipts is not None and request is not None:
                stamped = receipts.stamp(
                    call_facts(request),
                    decision,
                    decided_by=decided_by,
                    votes=votes,
                    quorum=quorum,
                )
            result = self._step(
                "decide",
                request_id,
                once,
                **self._decide_values(stamped, decided_by, channel, creator_may_vote),
                **actor_args(decided_by),
                voter=voter,
                in_queue=in_queue or None,
                in_escalation=in_escalation,
                bypass_quorum=bypass_quorum or None,
                receipt_votes=votes if quorum > 1 else None,
            )
            if result[0] != "need_votes":
                recorded = self._outcome(result, request_id, decision)
                if started and result[0] != "repeat":  # a span in the request's own trace
                    outcome = traced.outcome_of(decision, result[0])
                    traced.decision(result[2:], recorded, outcome, decided_by, channel, started)
                return recorded
            # the quorum's last vote, with other voters than we read: sign for those
            votes = json.loads(result[1])
        raise RuntimeError(f"decide of {request_id} kept finding other votes: {result!r}")

    def _decide_values(
        self, decision: Decision, decided_by: str, channel: str | None, creator_may_vote: bool
    ) -> dict[str, Any]:
        """decide.lua's arguments for `decision` by `decided_by`."""
        # decided_at is left out: the step sets it, on Redis's clock
        recorded = decision.model_copy(update={"decided_by": decided_by, "decided_at": None})
        return {
            "outcome": decision.outcome.value,
            "status": OUTCOME_STATUS[decision.outcome].value,
            "decision": json.dumps(recorded.public(), separators=(",", ":"), ensure_ascii=False),
            "args_hash": decision.args_hash or None,
            "retention": self.store.retention,
            "vote_hash": args_hash(decision.args) if decision.args is not None else None,
            "channel": channel or None,
            "creator_may_vote": creator_may_vote or None,
        }

    def escalate(
        self,
        request_id: str,
        target: str | None = None,
        *,
        reason: str | None = None,
        by: str,
        args_hash: str | None = None,
        once: Once | None = None,
        in_queue: str | None = None,
        in_escalation: int | None = None,
    ) -> Request:
        """Move a pending request to another handler queue (default: its queue's `escalate_to`).

        Its deadline there is its first arrival there plus that queue's timeout (see move in
        lib.lua). `in_queue`, `in_escalation` and `once` work as for `decide`: a repeat or a
        stale escalation from a queue it has left is refused atomically (`Conflict` code
        `escalated`). Which targets a person may choose is the decision service's call.
        """
        config = self.store.config
        if target is None:
            current = self.requests.get_request(request_id)
            if not current.is_pending:
                raise Conflict(
                    f"request {request_id} is already {current.status.value}", request=current
                )
            target = config.escalation_target(current.queue)
            if target is None:
                raise InvalidInput(
                    f"queue {current.queue!r} has no escalate_to; name a target queue",
                    code="no_target",
                )
        self.store.check_queue(target)
        # `at` and `from_queue` are added by the step, which knows both
        entry = {"event": "escalated", "by": by, "to_queue": target, "reason": reason}
        started = tracing.now_ns()
        result = self._step(
            "escalate",
            request_id,
            once,
            target=target,
            timeout_s=config.timeout_for(target),
            quorum=config.quorum_for(target),
            entry=json.dumps({k: v for k, v in entry.items() if v is not None}),
            args_hash=args_hash or None,
            in_queue=in_queue or None,
            in_escalation=in_escalation,
            **actor_args(by),
        )
        moved = self._outcome(result, request_id, None)
        if started and result[0] == "ok":  # a span in the request's own trace
            traced.escalation(result[2:], moved, by, from_queue=str(result[1]), started_ns=started)
        return moved

    def _step(self, name: str, request_id: str, once: Once | None, **args: Any) -> list[Any]:
        """Run a step on one request with every key it may touch in KEYS.

        Which keys those are depends on stored fields: the streams of the queue the request
        waits in (and moves to), and its run's keys. We pass the streams of every configured
        queue and the run the request id names (`broker.domain.ids`), without a read. The step checks,
        atomically and before writing anything, that what it is about to write is among them;
        if not (a request left in a queue since dropped from the config, an id not in the round
        format), it writes nothing and replies `need_stream`/`need_run` with the name, and we
        call again with that key too. Fields can change between two calls, but each call judges
        them afresh inside its own atomic step, so the retry is as safe as the first try.
        """
        keys = self.store.keys
        run_id = (
            run_of_request(request_id) if name == "decide" else None
        )  # escalating ends no round
        extra: list[str] = []
        once_key, once_ttl = once if once else (None, None)
        values = {k: v for k, v in args.items() if v is not None}  # JSON null is truthy in Lua
        for _ in range(_TRIES):
            script_keys = keys.decide_keys(
                request_id, run_id, [*self.store.config.queues, *extra], once_key
            )
            result = self.store.scripts.run(
                name,
                script_keys,
                id=request_id,
                maxlen=self.store.maxlen,
                **({"run_id": run_id} if run_id else {}),
                **({"once_ttl": once_ttl} if once_key else {}),
                **values,
            )
            if result[0] == "need_stream":
                extra.append(result[1])
            elif result[0] == "need_run":
                run_id = result[1]
            else:
                return result
        raise RuntimeError(f"{name} of {request_id} kept asking for more keys: {result!r}")

    def _outcome(self, result: list[Any], request_id: str, decision: Decision | None) -> Request:
        """The request a step replied with, or the error its code means."""
        code, detail, fields = result[0], result[1], result[2:]
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
        raise RuntimeError(f"unexpected script result {result!r}")
