"""The broker's domain models: the wire models of the client package, as the server holds them.

Each field list is written once, in `approval_broker_client.models` (what travels over HTTP);
the classes here extend those and add only what the server needs: no unknown field kept or
echoed (`extra="ignore"`, where the client keeps them), the Redis forms a stored request comes
in (votes as JSON text, epoch seconds, empty strings), the bounds the broker enforces on what
it accepts (`quorum <= MAX_QUORUM`), the field the broker sets (`NewRequest.created_by`), and
`public()` dumps. They keep the client's class names, so `/openapi.json` and every JSON body
stay as they were.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from approval_broker_client import models as wire
from approval_broker_client.models import Kind, Outcome, RunStatus, Status
from pydantic import ConfigDict, Field, field_validator

KINDS: tuple[str, ...] = ("approval", "question", "external")

EventType = Literal[
    "approval.requested",
    "approval.decided",
    "approval.escalated",
    "approval.timed_out",
    "approval.voted",  # one approval of a request that needs more (quorum), still pending
    "approval.receipt_refused",  # an approved tool did not run: its receipt did not hold
    "approval.shadow_rule",  # a shadow rule would have decided this request (it decided nothing)
]

MAX_QUORUM = 10

SERVER = ConfigDict(extra="ignore")
"""What the server reads: unknown fields are dropped, never stored or echoed."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def from_timestamp(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class Decision(wire.Decision):
    """What a person (or a system) answered. `decided_by`/`decided_at` are set by the broker."""

    model_config = SERVER

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class HistoryEntry(wire.HistoryEntry):
    """One thing that happened to a request besides its decision: an escalation or a delivery."""

    model_config = SERVER


class Vote(wire.Vote):
    """One person's approval of a request that needs several (its `quorum`).

    `by` is the person (see `broker.domain.quorum`), `args_hash` the args they approved: the request's
    own for `approved`, the new ones for `modified`; only votes for the same args add up.
    """

    model_config = SERVER


class Request(wire.Request):
    """A durable request for a person's decision on one tool call (contract: docs/internals.md)."""

    # Read from its Redis hash as well as from JSON: the hash keeps the votes as JSON text,
    # `acked_until` as epoch seconds and an unset person as an empty string.
    model_config = SERVER

    # The nested models are the server's (no unknown field kept); the fields are the client's.
    decision: Decision | None = None
    history: list[HistoryEntry] = Field(default_factory=list)  # type: ignore[assignment]  # the server's HistoryEntry, a subclass of the client's: a list is invariant to mypy
    approvals: list[Vote] = Field(default_factory=list)  # type: ignore[assignment]  # likewise the server's Vote

    @field_validator("approvals", mode="before")
    @classmethod
    def _approvals_json(cls, value: Any) -> Any:
        """The hash keeps the votes as JSON text."""
        if isinstance(value, str | bytes):
            return json.loads(value) if value else []
        return value

    @field_validator("created_by", "acked_by", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return value or None

    @field_validator("acked_until", mode="before")
    @classmethod
    def _epoch(cls, value: Any) -> Any:
        """The hash keeps epoch seconds, as for `expires_at`."""
        if value in (None, "", b""):
            return None
        if isinstance(value, str | bytes | int | float):
            try:
                return from_timestamp(float(value))
            except ValueError:
                return value  # ISO text (a request read back from JSON)
        return value


class NewRequest(wire.NewRequest):
    """What a caller gives to create a request; the broker fills in the rest."""

    model_config = SERVER

    # The broker's bound on what a caller may ask (the client leaves it to the broker).
    quorum: int | None = Field(
        default=None,
        ge=1,
        le=MAX_QUORUM,
        description="approvals needed (distinct people); never fewer than the queue's quorum",
    )
    created_by: str | None = Field(
        default=None,
        max_length=200,
        description="set by the broker: the principal that asked (never counts as an approver)",
    )


class Run(wire.Run):
    """An agent run the fleet executes, pauses on deferred calls and resumes round by round."""

    model_config = SERVER

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


__all__ = [
    "KINDS",
    "MAX_QUORUM",
    "Decision",
    "EventType",
    "HistoryEntry",
    "Kind",
    "NewRequest",
    "Outcome",
    "Request",
    "Run",
    "RunStatus",
    "Status",
    "Vote",
    "from_timestamp",
    "utcnow",
]
