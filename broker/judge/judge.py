"""The judge every channel decides through: `Judge.decide` (sync) and `Judge.adecide` (async).

Route or channel -> `Judge.decide` -> the store's decide step (`broker.store.decisions`) ->
`Scripts.run` -> decide.lua. The rules are the pure checks of `broker.judge.deciding` (and
`broker.judge.rule_decisions` for a decision that keeps a rule); around them this holds the
I/O only: one read of the request (none when the caller read it), the step, one read after a
lost race. Both faces share that core, the way httpx's clients share `BaseClient`: the sync
face for the channels' handlers (in the API's threads), the CLI and workers; the async face on
redis.asyncio for the API's event loop, where a decision checked against a schema has its
checks in a thread and a decision that keeps a rule (or a Redis Cluster, or a test double) runs
the sync face in a thread.

Whoever hosts the judge may hand it an observer: it is called once per recorded decision (the
API counts them in its metrics), never for a repeat. It never speaks HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import partial
from typing import Any, Protocol

import anyio.to_thread

from broker.domain.config import Config
from broker.domain.errors import Conflict, InvalidInput
from broker.domain.models import Decision, Request
from broker.domain.persons import voter_of
from broker.domain.principals import EVERY_ROLE, Principal
from broker.domain.printable import printable
from broker.domain.rules.models import Rule
from broker.facade import Broker, Once
from broker.judge.deciding import (
    Decided,
    channel_of,
    check_channels,
    check_may_decide,
    check_not_creator,
    checks_schemas,
    plan,
    refusal,
    repeat_of,
    same_decision,
)
from broker.judge.rule_decisions import (
    Remember,
    check_remembers,
    covered,
    new_rule,
    rule_to_keep,
)
from broker.store.decide_step import Resume, Step

Observer = Callable[[Decided], None]
"""Told of each recorded decision (not of a repeat), after its step."""


class ResumeSink(Protocol):
    """Where the async face hands a round its step completed, for its resume job to be
    enqueued at once (`broker.runs.direct_resume.DirectResumes`, the API's): the step claims
    the round as `claimant` and leaves its outbox entry where the resumers look only later.
    `resume` returns once the job is enqueued (or was left to the resumers); it never raises."""

    claimant: str

    async def resume(self, resume: Resume) -> None: ...


class Judge:
    """Decide requests on `broker` for deciders replying through named channels."""

    def __init__(
        self,
        broker: Broker,
        config: Config | None = None,
        *,
        observe: Observer | None = None,
        async_redis: Callable[[], Any] | None = None,
        resumes: ResumeSink | None = None,
    ) -> None:
        """`async_redis` gives the host's redis.asyncio client on the broker's Redis (made on
        first use, on the host's loop): without it `adecide` runs the sync face in a thread.
        `resumes` (with `async_redis`): a round an async decision completes goes there, for
        its resume job to be enqueued without waiting for a resumer."""
        self.broker = broker
        self.config = config or broker.config
        self.observe = observe
        self.async_redis = async_redis
        self.resumes = resumes

    # ---- the checks a channel asks before it shows a form ------------------------------------

    def refusal(self, decider: Principal, request: Request, via: Collection[str]) -> str | None:
        """Why `decider`, replying through `via`, may not decide `request` (None: it may)."""
        return refusal(request, decider, via, self.config)

    def check_may_decide(self, decider: Principal, request: Request, via: Collection[str]) -> None:
        """Forbidden unless `decider` may decide `request` through `via`."""
        check_may_decide(request, decider, via, self.config)

    # ---- deciding ------------------------------------------------------------------------------

    def decide(
        self,
        request_id: str,
        decision: Decision,
        decider: Principal,
        *,
        via: Collection[str],
        decided_by: str | None = None,
        current: Request | None = None,
        once: Once | None = None,
        remember: Remember | None = None,
    ) -> Decided:
        """Decide `request_id` for `decider`, replying through the channels `via`; with
        `remember`, keep that rule too (the result names it, and the siblings it decided).

        `decided_by` is the name recorded (default the decider's: a webhook reply names its
        person), `current` the request as the caller read it (saves a read), `once` the
        reply's one-time marker, spent only with a decision. Raises NotFound, Forbidden
        (roles, a channel outside the request's queue, the creator's own approval, an
        escalation off its queue's chain), InvalidInput (`invalid_args`, `invalid_rule`...),
        or Conflict when someone else (or another decision) won, the request was escalated
        meanwhile (code `escalated`: checked by queue and by escalation count, so a move
        away and back still counts), or `once` was already spent (code `replayed`). The same
        decider repeating its decision or its escalation gets the request back instead, with
        nothing recorded.
        """
        if remember is not None:
            check_remembers(decision)
        decided_by = printable(decided_by or decider.name)
        check_channels(decider, via, self.config)
        current = current or self.broker.get_request(request_id)
        if remember is not None and current.is_pending:
            return self._remember(current, decision, decider, via, decided_by, once, remember)
        step = plan(current, decision, decider, via, self.config, decided_by=decided_by, once=once)
        if isinstance(step, Decided):
            return step
        try:
            request = self.broker.decisions.decide(step)
        except Conflict as exc:
            if repeat_of(exc, step):
                return Decided(exc.request, recorded=False)
            raise
        except InvalidInput as exc:
            if exc.code != "same_queue":
                raise
            raise _moved(self.broker.get_request(current.id)) from None
        return self._recorded(Decided(request, recorded=True, channel=step.channel or ""))

    async def adecide(
        self,
        request_id: str,
        decision: Decision,
        decider: Principal,
        *,
        via: Collection[str],
        decided_by: str | None = None,
        current: Request | None = None,
        once: Once | None = None,
        remember: Remember | None = None,
    ) -> Decided:
        """`decide` for an event loop: its reads and its step on redis.asyncio, its schema
        checks in a thread; the sync face in a thread where there is no async one (see the
        module's docstring)."""
        if remember is not None or self.async_redis is None or not self.broker.decisions.runs_async:
            call = partial(
                self.decide,
                request_id,
                decision,
                decider,
                via=via,
                decided_by=decided_by,
                current=current,
                once=once,
                remember=remember,
            )
            return await anyio.to_thread.run_sync(call)
        client = self.async_redis()
        decided_by = printable(decided_by or decider.name)
        check_channels(decider, via, self.config)
        current = current or await self.broker.decisions.aread(client, request_id)
        planning = partial(plan, current, decision, decider, via, self.config)
        if checks_schemas(decision):
            step = await anyio.to_thread.run_sync(
                partial(planning, decided_by=decided_by, once=once)
            )
        else:
            step = planning(decided_by=decided_by, once=once)
        if isinstance(step, Decided):
            return step
        sink = self.resumes
        try:
            request, resume = await self.broker.decisions.adecide_resuming(
                step, client, sink.claimant if sink is not None else None
            )
        except Conflict as exc:
            if repeat_of(exc, step):
                return Decided(exc.request, recorded=False)
            raise
        except InvalidInput as exc:
            if exc.code != "same_queue":
                raise
            raise _moved(await self.broker.decisions.aread(client, current.id)) from None
        if resume is not None and sink is not None:
            await sink.resume(resume)
        return self._recorded(Decided(request, recorded=True, channel=step.channel or ""))

    def _recorded(self, done: Decided) -> Decided:
        if self.observe is not None:
            self.observe(done)
        return done

    # ---- a decision that keeps a rule ----------------------------------------------------------

    def _remember(
        self,
        current: Request,
        decision: Decision,
        decider: Principal,
        via: Collection[str],
        decided_by: str,
        once: Once | None,
        remember: Remember,
    ) -> Decided:
        """Decide a pending `current` and keep the rule `remember` names, with the siblings of
        its run the rule covers, in one step; a request no longer pending is any decision's."""
        check_may_decide(current, decider, via, self.config)
        check_not_creator(current, decision, decider, decided_by, self.config)
        decision, body = rule_to_keep(current, decision, decider, self.config, remember=remember)
        rules = self.broker.requests.rules
        rules.check_names(body, "remember")
        rule = new_rule(
            body, current, decider, via, self.config, decided_by=decided_by, now=rules.now()
        )
        siblings = self.covered_siblings(current, rule)
        step = Step(
            current.id,
            decision,
            decided_by,
            voter=voter_of(self.config, decided_by),
            in_queue=current.queue,
            in_escalation=current.escalations,
            once=once,
            channel=channel_of(current, via, self.config),
            creator_may_vote=EVERY_ROLE in decider.roles,
            request=current,
        )
        try:
            kept = self.broker.remembering.remember(step, rule, siblings)
        except Conflict as exc:
            if exc.code == "conflict" and same_decision(exc.request.decision, decision, decided_by):
                return Decided(exc.request, recorded=False)
            raise
        done = Decided(
            kept.request,
            recorded=True,
            channel=step.channel or "",
            rule=kept.rule,
            siblings=kept.siblings,
        )
        self._recorded(done)
        return done

    def covered_siblings(self, request: Request, rule: Rule) -> list[Request]:
        """The other pending requests of the request's run that the new rule covers (none for
        a shadow rule, which decides nothing)."""
        if rule.mode != "enforce":
            return []
        agent, others = self.broker.remembering.run_pending(request)
        return covered(rule, agent, others, self.config, self.broker.requests.rules.now())

    # ---- "I'm on it" ---------------------------------------------------------------------------

    def ack(self, request_id: str, decider: Principal, *, via: Collection[str]) -> Request:
        """ "I'm on it" from someone who may decide the request: it stays pending and its
        escalation waits for the queue's `ack_timeout_s`. Never a vote, never an outcome.

        Raises NotFound, Forbidden (as for deciding) or Conflict (decided or timed out, with
        the request; code `escalated` when it moved meanwhile).
        """
        current = self.broker.get_request(request_id)
        check_may_decide(current, decider, via, self.config)
        return self.broker.acks.ack(
            current.id,
            acked_by=printable(decider.name),
            in_queue=current.queue,
            channel=channel_of(current, via, self.config),
        )


def _moved(request: Request) -> Conflict:
    """Escalated to the same target by someone else between our read and the step."""
    return Conflict(
        f"request {request.id} was escalated to {request.queue}", request=request, code="escalated"
    )
