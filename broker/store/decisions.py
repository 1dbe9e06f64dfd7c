"""Decisions: recording a person's (or a system's) outcome, or moving a request to another queue.

Each is one Lua step (decide.lua, escalate.lua; a decision that keeps a rule is
`broker.store.remembering`'s): the first decision wins, a one-time marker is spent with it, and
the last answered call of a round writes its run's resume to the outbox in the same step. The step replies with the request
as stored, so there is no read around it. Who may decide, and what a channel's reply means, is
decided before this (`broker.judge`): here a `Step` becomes keys and arguments and is run.

Two faces share one core (`broker.store.decide_step.StepCall`): `decide` on the broker's sync
client, `adecide` on an asyncio client (the API's event loop), each only sending the calls
the core builds and handing it the replies.
"""

from __future__ import annotations

from typing import Any

from broker.domain.errors import NotFound
from broker.domain.models import Request
from broker.store.decide_step import Resume, Step, StepCall
from broker.store.handles import Store
from broker.store.request_hash import parse_request
from broker.store.requests import Requests


class Decisions:
    """The decide step of every decision (and escalation), sync or async."""

    def __init__(self, store: Store, requests: Requests) -> None:
        self.store = store
        self.requests = requests

    @property
    def runs_async(self) -> bool:
        """Can `adecide` run here: a single Redis whose scripts go by SHA (not a cluster, whose
        steps wait for a replica, nor a test double)."""
        return self.store.scripts.runs_async

    def decide(self, step: Step) -> Request:
        """Record `step`'s decision (or escalation); the first one wins.

        Raises `Conflict` (carrying the request as it stands) when it was already decided or
        timed out (code `conflict`), moved on (`escalated`) or the marker was spent
        (`replayed`); `InvalidInput` for a decision that can never apply; `Forbidden`
        (`creator_may_not_approve`) for the creator's own approval; `NotFound` for an unknown
        id. An approval of a request whose `quorum` is above 1 is the vote of `step.voter`:
        the request stays pending until the quorum-th person approves the same args; a
        repeated vote writes nothing and gets the request. With `[receipts]` on, an outcome
        that lets something run is stored with its receipt, signed just before the step.
        """
        if step.needs_read(self.store):
            step = step.with_read(self.store, self.requests.get_request(step.request_id))
        call = StepCall(self.store, step)
        while True:
            name, keys, args = call.script()
            recorded = call.answer(self.store.scripts.run(name, keys, **args))
            if recorded is not None:
                return recorded

    async def adecide(self, step: Step, client: Any) -> Request:
        """`decide` on `client`, a redis.asyncio client on the same Redis (`runs_async`)."""
        return (await self.adecide_resuming(step, client))[0]

    async def adecide_resuming(
        self, step: Step, client: Any, claimant: str | None = None
    ) -> tuple[Request, Resume | None]:
        """`adecide`; with a `claimant` (a caller that enqueues the resume job itself), also
        the round the step completed and claimed for it (`StepCall`), if any."""
        if step.needs_read(self.store):
            step = step.with_read(self.store, await self.aread(client, step.request_id))
        call = StepCall(self.store, step, claimant)
        while True:
            name, keys, args = call.script()
            recorded = call.answer(await self.store.scripts.arun(name, keys, client, **args))
            if recorded is not None:
                return recorded, call.resume

    async def aread(self, client: Any, request_id: str) -> Request:
        """The request, read on `client` (`Requests.get_request`'s async twin: one HGETALL, in
        one pipeline with the others this pass of the loop sends: `broker.store.coalesced`)."""
        raw = await self.store.scripts.coalesced.hgetall(
            client, self.store.keys.request(request_id)
        )
        if not raw:
            raise NotFound(f"no request with id {request_id!r}")
        return parse_request(raw)
