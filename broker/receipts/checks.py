"""The check at execution: does an approved call's receipt still prove it, right before it runs?

Called by whatever is about to run an approved tool: the fleet worker's tool guard
(`broker.runs.tool_guard`) and the API route a remote agent's `BrokerApprovals` spends its receipt
through. The signature, expiry, request, tool and args are checked by `broker.domain.receipts`; the
approver's current roles (with `[receipts] recheck_roles`) here, against the config as it is
now; single use and the records by receipt.lua, in the one atomic step that spends the jti and
counts the tool as started. A refusal is recorded (event `approval.receipt_refused`, a history
entry, a counter for `/metrics`) and raised as `ReceiptRefused`: the tool must not run.
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread

from broker.domain.config import Config
from broker.domain.models import Outcome, Request
from broker.domain.persons import EMAIL, WEBHOOK, approver_known_as, webhook_person
from broker.domain.principals import ADMIN, Principal
from broker.domain.receipts import ReceiptRefused, Receipts, jti_digest, spent_ttl
from broker.facade import Broker

RUNS_A_TOOL = frozenset({Outcome.approved, Outcome.modified})
"""Outcomes whose tool runs where the run goes on (an answer is the tool's result itself)."""


def deciding_principal(config: Config, decided_by: str) -> Principal | None:
    """Who `decided_by` is in the config as it is now, with their roles now; None when the
    config no longer knows them (an approver removed, a webhook endpoint gone or notify-only)."""
    if decided_by == ADMIN:
        return Principal(ADMIN, frozenset({"*"}))
    if decided_by.startswith(WEBHOOK):
        endpoint = decided_by[len(WEBHOOK) :].split("/", 1)[0]
        channel = decided_by[: len(WEBHOOK) + len(endpoint)]
        if config.channel_problem(channel) is not None or not config.decides_through(channel):
            return None
        person = webhook_person(decided_by)
        named = approver_known_as(config, person) if person else None
        if named is not None:  # the person it names must still be one who may decide
            return Principal(named, frozenset(config.approvers[named].roles))
        return Principal(channel, frozenset(config.channel_roles(channel)))
    if decided_by.startswith(EMAIL):
        named = approver_known_as(config, decided_by)
        return Principal(named, frozenset(config.approvers[named].roles)) if named else None
    approver = config.approvers.get(decided_by)
    return Principal(decided_by, frozenset(approver.roles)) if approver else None


def revoked(config: Config, request: Request, claims: dict[str, Any]) -> str | None:
    """Why the receipt's approver (or one of its quorum's voters) may no longer decide
    `request`, or None. A rule's decision stands on the rule, not on roles."""
    by = str(claims.get("decided_by") or "")
    if by.startswith("rule:"):
        return None
    quorum = claims.get("quorum")
    voters = list(quorum.get("votes") or []) if isinstance(quorum, dict) else []
    queue_roles = config.queue_roles(request.queue)
    for name in dict.fromkeys([by, *voters]):
        principal = deciding_principal(config, str(name))
        if principal is None:
            return f"{name!r} is no longer an approver in the config"
        if not principal.may_decide(request, queue_roles):
            return f"{name!r} no longer holds a role that may decide request {request.id}"
    return None


class ReceiptChecks:
    """Checks and spends receipts on `broker`; a no-op when `[receipts]` has no key."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @property
    def receipts(self) -> Receipts | None:
        return self.broker.store.receipts

    def spend(
        self,
        request: Request,
        *,
        tool_name: str,
        args: dict[str, Any],
        run_field: str | None = None,
    ) -> dict[str, Any] | None:
        """Check `request`'s receipt for running `tool_name` with `args` now, and spend it in
        the step that counts the tool as started in its run's `run_field` (if given).

        Returns the receipt's claims (None when receipts are off); raises `ReceiptRefused`,
        after recording the refusal, when the tool must not run.
        """
        if self.receipts is None:
            return None
        claims = self.check(request, tool_name=tool_name, args=args)
        reply = self._step(
            request,
            claims["jti"],
            mode="spend",
            jti_ttl=spent_ttl(claims),
            run_field=run_field,
            with_run=run_field is not None,
        )
        self.spent(request, reply)
        return claims

    def check(self, request: Request, *, tool_name: str, args: dict[str, Any]) -> dict[str, Any]:
        """The claims of `request`'s receipt if it proves `tool_name` may run with `args` now
        (all but single use, which spending checks); else the refusal is recorded and raised
        as `ReceiptRefused`. Receipts must be on."""
        try:
            return self.verify(request, tool_name=tool_name, args=args)
        except ReceiptRefused as exc:
            self.refuse(request, exc.reason)
            raise

    async def acheck(
        self, request: Request, *, tool_name: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """`check` from a coroutine: the check itself on the loop (CPU, microseconds), the
        refusal's record, and the scripts' loading if they are not yet (before a caller queues
        the spend on an asyncio MULTI), in a thread: never blocking the loop."""
        try:
            claims = self.verify(request, tool_name=tool_name, args=args)
        except ReceiptRefused as exc:
            await anyio.to_thread.run_sync(self.refuse, request, exc.reason)
            raise
        scripts = self.broker.store.scripts
        if not scripts.loaded:
            await anyio.to_thread.run_sync(scripts.load)
        return claims

    def verify(self, request: Request, *, tool_name: str, args: dict[str, Any]) -> dict[str, Any]:
        """`check`'s one core, without recording a refusal: the claims, or `ReceiptRefused`."""
        receipts = self.receipts
        assert receipts is not None
        token = request.decision.receipt if request.decision is not None else None
        claims = receipts.verify(token, request_id=request.id, tool_name=tool_name, args=args)
        if claims.get("tool_call_id") != request.tool_call_id:
            raise ReceiptRefused("other_request", "the receipt is for another call")
        if self.broker.config.receipts.recheck_roles:
            why = revoked(self.broker.config, request, claims)
            if why:
                raise ReceiptRefused("approver_revoked", why)
        return claims

    def queue_spend(
        self, pipe: Any, request: Request, claims: dict[str, Any], *, run_field: str | None
    ) -> Any:
        """Queue on `pipe` (a MULTI beside the run's own writes) the step that spends the
        checked receipt and counts its tool as started in `run_field`; `spent` reads its
        reply (given a client rather than a pipeline, the step runs now: its reply)."""
        return self._step(
            request,
            claims["jti"],
            mode="spend",
            jti_ttl=spent_ttl(claims),
            run_field=run_field,
            with_run=run_field is not None,
            client=pipe,
        )

    def spent(self, request: Request, reply: Any) -> None:
        """`ReceiptRefused` when the spending step's `reply` says the jti was spent before
        (the step recorded the refusal)."""
        word = reply[0] if isinstance(reply, list | tuple) and reply else reply
        if word in ("spent", b"spent"):
            raise ReceiptRefused("spent", f"the receipt of request {request.id} was already used")

    def refuse(self, request: Request, reason: str) -> None:
        """Record a refusal: event `approval.receipt_refused`, history, the counter."""
        self._step(request, "", mode="refuse", reason=reason, with_run=False)

    def _step(
        self, request: Request, jti: str, *, with_run: bool, client: Any = None, **args: Any
    ) -> list[Any]:
        store = self.broker.store
        run_id = request.run_id if with_run else None
        keys = store.keys.receipt_keys(request.id, request.queue, jti_digest(jti), run_id)
        values = {k: v for k, v in args.items() if v is not None}
        return store.scripts.run(
            "receipt",
            keys,
            client=client,
            id=request.id,
            queue=request.queue,
            maxlen=store.maxlen,
            **values,
        )
