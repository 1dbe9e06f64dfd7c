"""The core's sections of the TOML config: queues, approvers, agents, MCP gateways and the
broker's own settings. A channel kind's section (`[slack]`, `[webhooks.NAME]`...) is the kind's
own (`broker.domain.channel_kinds`); `broker.domain.config` puts the whole file together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from broker.domain import channel_kinds
from broker.domain.config_errors import unknown_name
from broker.domain.settings import RedisFsync

DEFAULT_QUEUE = "default"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_ACK_TIMEOUT_S = 900.0


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class QueueConfig(Section):
    channels: list[str] = Field(default_factory=lambda: ["inbox"])
    timeout_s: Annotated[float, Field(gt=0)] = DEFAULT_TIMEOUT_S
    escalate_to: str | None = None
    roles: list[str] = Field(
        default_factory=list,
        description="minimum roles: a decider needs one of these as well as one of a request's"
        " allowed_roles",
    )
    quorum: Annotated[int, Field(ge=1, le=10)] = 1  # distinct approvers needed
    ack_timeout_s: Annotated[float, Field(gt=0)] = (
        DEFAULT_ACK_TIMEOUT_S  # "I'm on it" holds this long
    )


class ApproverConfig(Section):
    """`[approvers.NAME]`: a principal (a person, or a service that asks). Besides its token
    and roles, each channel kind may name the person there by one key of its own
    (`slack_user_id`, `email`, `telegram_user_id`...: the kind's `approver_field`)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    token_sha256: str | None = None
    roles: list[str] = Field(default_factory=list)

    @field_validator("token_sha256")
    @classmethod
    def _hex64(cls, value: str | None) -> str | None:
        if value is not None and (
            len(value) != 64 or any(c not in "0123456789abcdef" for c in value)
        ):
            raise ValueError(
                "must be 64 lowercase hex digits (run `approval-broker token new NAME`)"
            )
        return value

    @model_validator(mode="after")
    def _identity_fields(self) -> ApproverConfig:
        """Every other key must be some kind's approver field, of that field's type."""
        fields = channel_kinds.approver_fields()
        for key, value in list((self.model_extra or {}).items()):
            owner = fields.get(key)
            if owner is None:
                raise ValueError(
                    unknown_name("key", key, ["token_sha256", "roles", *sorted(fields)])
                )
            if value is None:
                continue
            try:
                TypeAdapter(owner.approver_field_type).validate_python(value, strict=True)
            except ValidationError:
                wanted = {int: "an integer", str: "a string"}.get(
                    owner.approver_field_type, "valid"
                )
                raise ValueError(f"{key}: must be {wanted}, got {value!r}") from None
        return self

    def identity(self, field: str) -> str | None:
        """The value of the approver field `field` (`"slack_user_id"`), as text, or None."""
        value = (self.model_extra or {}).get(field)
        return None if value is None or value == "" else str(value)

    @property
    def identities(self) -> dict[str, str]:
        """Every approver field this approver has, as text (`{"email": "a@example.com"}`)."""
        return {k: str(v) for k, v in (self.model_extra or {}).items() if v not in (None, "")}


class AgentConfig(Section):
    path: str = Field(description="import path of the pydantic-ai Agent, 'package.module:name'")
    deps: str | None = Field(default=None, description="import path of a deps factory")
    queue: str = DEFAULT_QUEUE
    tool_queues: dict[str, str] = Field(default_factory=dict)
    max_rounds: Annotated[int, Field(ge=1)] = 10
    # the job that paused a run waits this long for the round's outcomes (under its timeout);
    # unset: the worker process's `[workers] live_wait_s`; 0: never
    live_wait_s: Annotated[float | None, Field(ge=0, le=600)] = None
    unanswered: Annotated[str, Field(pattern="^(reject|raise)$")] = "reject"  # on a new prompt


class McpGatewayConfig(Section):
    """`[mcp_gateways.NAME]`: an MCP server whose gated tool calls need a person's approval
    (served by `approval-broker mcp-gateway NAME`). `token` may be `env:NAME`; it is read by
    the gateway when it starts, never by the broker's other roles."""

    upstream: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, min_length=1, description="the upstream MCP server's stdio command"
    )
    upstream_url: Annotated[str, Field(pattern=r"^https?://")] | None = Field(
        default=None, description="or the upstream's Streamable HTTP endpoint"
    )
    gate: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: ["*"], description="tool-name globs that need approval"
    )
    queue: str = DEFAULT_QUEUE
    broker_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    token: str | None = None
    timeout_s: Annotated[float, Field(gt=0, le=365 * 86400)] | None = None
    upstream_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0

    @model_validator(mode="after")
    def _one_upstream(self) -> McpGatewayConfig:
        if (self.upstream is None) == (self.upstream_url is None):
            raise ValueError("give exactly one of upstream (a command) and upstream_url")
        return self


class BrokerSection(Section):
    max_rounds: Annotated[int, Field(ge=1)] = 10
    stream_maxlen: Annotated[int, Field(ge=1000)] = 1_000_000
    retention_s: Annotated[float, Field(ge=60)] = 30 * 86400  # how long a decided request is kept
    redis_cluster: bool = False  # as APPROVAL_BROKER_REDIS_CLUSTER=1
    # appendfsync of the embedded Redis, and the least a Redis of your own is expected to run
    # (`broker.redis.durability`); APPROVAL_BROKER_REDIS_FSYNC wins when set
    redis_fsync: RedisFsync = "always"


class AuditSection(Section):
    """`[audit]`: the tamper-evident audit trail (docs/audit.md). Off, the steps write no entry
    (what `bench/bench_audit.py` compares against); kept `retention_days`, then trimmed."""

    enabled: bool = True
    retention_days: Annotated[float, Field(ge=1)] = 365.0


class WorkersSection(Section):
    """`[workers]`: how an `approval-broker worker` process runs agent runs."""

    concurrency: Annotated[int, Field(ge=1, le=1000)] = 50  # runs at once per worker process
    run_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 600.0  # one round of one run, at most
    loop_block_s: Annotated[float, Field(ge=0.5, le=600)] = 10.0  # sync code holding the loop
    # how long the job that paused a run waits in place for the round's outcomes, for agents
    # that set no `live_wait_s` of their own (0: not at all); at most half the process's slots
    # wait at once (`broker.runs.live_wait.LiveWaits`), a `--burst` worker never by default
    live_wait_s: Annotated[float, Field(ge=0, le=600)] = 2.0
    # a killed worker process's jobs count as abandoned (and are retried) this long after its
    # last heartbeat; its heartbeats and the recovery pass run at a sixth and half of it
    abandoned_after_s: Annotated[int, Field(ge=5, le=3600)] = 30


class ReceiptsSection(Section):
    """`[receipts]`: signed approval receipts, checked where the tool runs (docs/receipts.md)."""

    key_file: Path | None = None  # Ed25519 private key (PEM); `up` makes one in its data dir
    previous_key_files: list[Path] = Field(default_factory=list)  # rotated out, still verify
    ttl_s: Annotated[float, Field(ge=10, le=7 * 86400)] = 900.0
    recheck_roles: bool = False  # the approver's roles checked again when the tool runs
