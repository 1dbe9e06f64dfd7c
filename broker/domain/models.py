"""The broker's domain: requests, decisions, runs and their history, as pydantic models."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, JsonValue, computed_field, field_validator, model_validator

from broker.domain.args_hash import args_hash, canonical_json  # noqa: F401 - their old home

Kind = Literal["approval", "question", "external"]
KINDS: tuple[str, ...] = ("approval", "question", "external")


class Status(StrEnum):
    pending = "pending"
    approved = "approved"
    modified = "modified"
    rejected = "rejected"
    answered = "answered"
    timed_out = "timed_out"


class Outcome(StrEnum):
    approved = "approved"
    modified = "modified"
    rejected = "rejected"
    answered = "answered"
    escalated = "escalated"
    timed_out = "timed_out"  # recorded by the sweeper; never accepted from a caller


class RunStatus(StrEnum):
    queued = "queued"
    running = "running"
    waiting = "waiting"
    finished = "finished"
    failed = "failed"


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


def utcnow() -> datetime:
    return datetime.now(UTC)


def from_timestamp(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class Decision(BaseModel):
    """What a person (or a system) answered. `decided_by`/`decided_at` are set by the broker."""

    outcome: Outcome
    reason: str | None = Field(default=None, max_length=10_000)
    args: dict[str, JsonValue] | None = None
    answer: JsonValue = None
    target: str | None = Field(default=None, max_length=200)
    args_hash: str | None = Field(default=None, max_length=128)
    metadata: dict[str, JsonValue] | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    rule: str | None = Field(default=None, description="the policy rule that decided, if one did")
    receipt: str | None = Field(
        default=None,
        max_length=8_000,
        description="set by the broker: the signed approval receipt (docs/receipts.md)",
    )

    @model_validator(mode="after")
    def _check_shape(self) -> Decision:
        if self.outcome is Outcome.modified and self.args is None:
            raise ValueError("a 'modified' decision needs 'args', the arguments to run with")
        if self.outcome is not Outcome.modified and self.args is not None:
            raise ValueError("'args' only goes with the 'modified' outcome")
        if self.outcome is not Outcome.escalated and self.target is not None:
            raise ValueError("'target' only goes with the 'escalated' outcome")
        return self

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class HistoryEntry(BaseModel):
    """One thing that happened to a request besides its decision: an escalation or a delivery."""

    at: datetime
    event: str
    by: str | None = None
    from_queue: str | None = None
    to_queue: str | None = None
    reason: str | None = None
    channel: str | None = None
    detail: str | None = None
    rule: str | None = None


class Vote(BaseModel):
    """One person's approval of a request that needs several (its `quorum`).

    `by` is the person (see `broker.domain.quorum`), `args_hash` the args they approved: the request's
    own for `approved`, the new ones for `modified`; only votes for the same args add up.
    """

    by: str
    at: datetime
    args_hash: str
    channel: str = ""


class Request(BaseModel):
    """A durable request for a person's decision on one tool call (contract: docs/architecture.md)."""

    id: str
    run_id: str | None = None
    round: int = 0
    tool_call_id: str
    tool_name: str
    args: dict[str, JsonValue] = Field(default_factory=dict)
    args_hash: str
    kind: Kind = "approval"
    prompt: str = ""
    data: JsonValue = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    queue: str = "default"
    allowed_roles: list[str] = Field(default_factory=list)
    callback: str | None = None
    created_at: datetime
    expires_at: datetime
    status: Status = Status.pending
    decision: Decision | None = None
    history: list[HistoryEntry] = Field(default_factory=list)
    suggested_rules: list[dict[str, JsonValue]] = Field(
        default_factory=list,
        description="rule bodies a person may remember with their decision (approvals only)",
    )
    escalations: int = 0  # times moved to another queue; an email link is bound to the count
    args_schema: dict[str, JsonValue] | None = None  # JSON Schema `modified` args must meet
    quorum: int = 1
    approvals: list[Vote] = Field(default_factory=list)
    created_by: str | None = None
    acked_by: str | None = None
    acked_until: datetime | None = None

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

    @computed_field  # type: ignore[prop-decorator]
    @property
    def approvals_by_args(self) -> dict[str, int]:
        """How many approvals each set of args has (by `args_hash`): they don't add up."""
        counts: dict[str, int] = {}
        for vote in self.approvals:
            counts[vote.args_hash] = counts.get(vote.args_hash, 0) + 1
        return counts

    @property
    def is_pending(self) -> bool:
        return self.status is Status.pending

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class NewRequest(BaseModel):
    """What a caller gives to create a request; the broker fills in the rest."""

    tool_name: str = Field(min_length=1, max_length=200)
    args: dict[str, JsonValue] = Field(default_factory=dict)
    kind: Kind = "approval"
    prompt: str | None = Field(default=None, max_length=20_000)
    data: JsonValue = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    queue: str = Field(default="default", min_length=1, max_length=200)
    timeout_s: float | None = Field(default=None, gt=0, le=365 * 86400)
    allowed_roles: list[str] = Field(default_factory=list)
    callback: str | None = None
    tool_call_id: str | None = Field(default=None, max_length=200)
    args_schema: dict[str, JsonValue] | None = Field(
        default=None,
        description="JSON Schema of the tool's arguments: a `modified` decision's args must"
        " meet it (a run's requests carry their tool's parameters schema)",
    )
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


class Run(BaseModel):
    """An agent run the fleet executes, pauses on deferred calls and resumes round by round."""

    id: str
    agent: str
    status: RunStatus = RunStatus.queued
    round: int = 0
    pending: list[str] = Field(default_factory=list)
    output: JsonValue = None
    error: str | None = None
    created_at: datetime
    updated_at: datetime

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
