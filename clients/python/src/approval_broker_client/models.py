"""The API's data on the wire: requests, decisions, votes, history and runs, as REST returns them.

The one definition of these shapes: an app imports them without the server, and the server
(`broker.domain.models`) extends them (it reads its Redis forms, keeps no unknown field and
bounds what it accepts more tightly) but never writes a field list of its own. Models read from
answers keep fields a newer broker adds (`extra="allow"`); models an app sends are checked
before sending.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, computed_field, model_validator

Kind = Literal["approval", "question", "external"]


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
    timed_out = "timed_out"  # recorded by the broker's sweeper; never accepted from a caller


class RunStatus(StrEnum):
    queued = "queued"
    running = "running"
    waiting = "waiting"
    finished = "finished"
    failed = "failed"


class Decision(BaseModel):
    """What a person (or a rule) answered; `decided_by`/`decided_at` are set by the broker."""

    model_config = ConfigDict(extra="allow")

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


class HistoryEntry(BaseModel):
    """One thing that happened to a request besides its decision (an escalation, a delivery)."""

    model_config = ConfigDict(extra="allow")

    at: datetime
    event: str
    by: str | None = None
    from_queue: str | None = None
    to_queue: str | None = None
    reason: str | None = None
    channel: str | None = None
    detail: str | None = None
    rule: str | None = None
    route: dict[str, JsonValue] | None = Field(
        default=None,
        description="`routed_by_rule`: what the route set (queue, quorum, timeout_s,"
        " on_timeout, risk)",
    )


class Vote(BaseModel):
    """One person's approval of a request that needs several (its `quorum`)."""

    model_config = ConfigDict(extra="allow")

    by: str
    at: datetime
    args_hash: str
    channel: str = ""


class Request(BaseModel):
    """A request for a person's decision on one tool call, as `GET /v1/requests/{id}` returns it."""

    model_config = ConfigDict(extra="allow")

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
    risk: str | None = Field(
        default=None, description="the risk label a routing rule gave it (null when none)"
    )

    @model_validator(mode="before")
    @classmethod
    def _computed_not_read(cls, value: Any) -> Any:
        """`approvals_by_args` comes from `approvals`: the one sent is not kept as an extra."""
        if isinstance(value, dict) and "approvals_by_args" in value:
            return {k: v for k, v in value.items() if k != "approvals_by_args"}
        return value

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form over a property
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
    """What an app sends to create a request; the broker fills in the rest."""

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
        description="approvals needed (distinct people); never fewer than the queue's quorum",
    )


class Run(BaseModel):
    """An agent run on the broker's fleet, as `GET /v1/runs/{id}` returns it."""

    model_config = ConfigDict(extra="allow")

    id: str
    agent: str
    status: RunStatus = RunStatus.queued
    round: int = 0
    pending: list[str] = Field(default_factory=list)
    output: JsonValue = None
    error: str | None = None
    created_at: datetime
    updated_at: datetime


class ErrorBody(BaseModel):
    """Every error answer's body: `{"error": code, "detail": text}`."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="a short machine-readable code")
    detail: str = Field(description="what went wrong, for people")


class ConflictBody(ErrorBody):
    """A 409's body: the request as it stands, decided or timed out."""

    request: Request = Field(description="the request as it stands: decided or timed out")


class Percentiles(BaseModel):
    """Time to a person's decision, in seconds, estimated from a fixed histogram (null: none)."""

    model_config = ConfigDict(extra="allow")

    p50: float | None = None
    p90: float | None = None


class TimeToDecision(Percentiles):
    by_queue: dict[str, Percentiles] = Field(default_factory=dict)


class RequestCounts(BaseModel):
    """Requests created in the window (`total`, by queue, tool, agent) and outcomes reached."""

    model_config = ConfigDict(extra="allow")

    total: int = 0
    by_outcome: dict[str, int] = Field(default_factory=dict)
    by_queue: dict[str, int] = Field(default_factory=dict)
    by_tool: dict[str, int] = Field(default_factory=dict)
    by_agent: dict[str, int] = Field(default_factory=dict)


class RejectReason(BaseModel):
    model_config = ConfigDict(extra="allow")

    reason: str
    count: int


class Stats(BaseModel):
    """`GET /v1/stats`: how approvals went over a window, of the requests the caller may see."""

    model_config = ConfigDict(extra="allow")

    since: datetime
    until: datetime
    requests: RequestCounts
    decided_by: dict[str, int] = Field(description="outcomes by person, rule and timeout")
    time_to_decision_s: TimeToDecision
    escalations: int = 0
    rule_hits: dict[str, int] = Field(default_factory=dict)
    reject_reasons: list[RejectReason] = Field(default_factory=list)
    by_approver: dict[str, int] | None = Field(
        default=None, description="answers and votes per person: admin and auditor only"
    )
