"""Configuration: the TOML file named by APPROVAL_BROKER_CONFIG plus the APPROVAL_BROKER_* environment.

A config is checked as a whole when it is loaded, so a fleet never starts with a queue that
routes to nowhere or an escalation chain that loops.
"""

from __future__ import annotations

import base64
import binascii
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.domain.chat_config import DiscordConfig, TelegramConfig
from broker.domain.errors import ConfigError
from broker.domain.persons import normal_address, normal_name

DEFAULT_QUEUE = "default"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_ACK_TIMEOUT_S = 900.0
CHANNEL_KINDS = ("inbox", "webhook", "slack", "email", "teams", "telegram", "discord")
WEBHOOK_EVENT_TYPES = (
    "approval.requested",
    "approval.decided",
    "approval.escalated",
    "approval.timed_out",
    "approval.voted",
)
"""The event types a webhook endpoint is sent (`notifiers.events`; an ack is Slack's only)."""
MIN_ADMIN_TOKEN_CHARS = 24
RedisFsync = Literal["always", "everysec"]
"""When Redis fsyncs its AOF (`appendfsync`): `always`, before it answers a write (a crash of
Redis or of the machine loses nothing acknowledged); `everysec`, about once a second (a crash
can lose the last 1-2 s of acknowledged writes). `broker.redis.durability` says more."""


class Settings(BaseSettings):
    """The APPROVAL_BROKER_* environment (contract: docs/architecture.md)."""

    model_config = SettingsConfigDict(env_prefix="APPROVAL_BROKER_", extra="ignore")

    redis_url: str | None = None
    config: Path | None = None
    admin_token: str | None = None
    port: int = 8000
    host: str = "127.0.0.1"
    key_prefix: str = "ab:"
    data_dir: Path | None = None
    redis_cluster: bool = (
        False  # REDIS_URL names a node of a Redis Cluster (broker/redis/cluster.py)
    )
    rq_redis_url: str | None = None  # RQ's own single Redis; required when clustered
    # the embedded Redis's appendfsync; unset: `[broker] redis_fsync` (default "always")
    redis_fsync: RedisFsync | None = None
    # The roles' log level: `up` passes WARNING (its banner stays readable), `up --verbose` INFO
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


def check_admin_token(settings: Settings) -> None:
    """Refuse a guessable admin token at start: it has every role on every request."""
    token = settings.admin_token
    if token and len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ConfigError(
            f"APPROVAL_BROKER_ADMIN_TOKEN is {len(token)} characters; it needs at least"
            f" {MIN_ADMIN_TOKEN_CHARS} (make one with `approval-broker token new admin`)"
        )


def resolve_secret(value: str | None, key: str) -> str | None:
    """Turn `env:NAME` into the value of that environment variable; refuse a missing one."""
    if value is None or not value.startswith("env:"):
        return value
    name = value[4:]
    if name not in os.environ:
        raise ConfigError(f"config: {key} names environment variable {name}, which is not set")
    return os.environ[name]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class QueueConfig(_Section):
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


class WebhookConfig(_Section):
    url: str
    secret: str | list[str]
    roles: list[str] = Field(default_factory=list)
    max_attempts: Annotated[int, Field(ge=1, le=50)] = 6
    backoff_s: Annotated[float, Field(gt=0)] = 0.5
    max_backoff_s: Annotated[float, Field(gt=0)] = 60.0
    timeout_s: Annotated[float, Field(gt=0)] = 10.0
    events: list[str] | None = None
    """The event types this endpoint is sent, whatever routed them (its queues' channels, a
    request's callback); None: every type. A deciding endpoint needs `approval.requested`, and
    `approval.escalated` where requests arrive in its queue by escalation."""
    decides: bool = True
    """Whether the endpoint's signed replies may decide (in the queues that list it, with its
    roles). False: a notify-only endpoint (an audit log): its replies are refused (403) and no
    rule it could have kept covers anything."""

    @field_validator("events")
    @classmethod
    def _known_events(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("names no event type (leave `events` out to be sent every type)")
        unknown = [name for name in value if name not in WEBHOOK_EVENT_TYPES]
        if unknown:
            raise ValueError(
                f"unknown event type {unknown[0]!r} (expected some of {', '.join(WEBHOOK_EVENT_TYPES)})"
            )
        return list(dict.fromkeys(value))

    @field_validator("secret")
    @classmethod
    def _standard_webhooks_secret(cls, value: str | list[str]) -> str | list[str]:
        """Refuse what the Standard Webhooks library would quietly decode into a weak key."""
        for secret in [value] if isinstance(value, str) else value or [""]:
            if not secret.startswith("whsec_"):
                raise ValueError("must start with 'whsec_' (a Standard Webhooks secret)")
            try:
                key = base64.b64decode(secret[len("whsec_") :], validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("must be 'whsec_' followed by base64") from None
            if not 24 <= len(key) <= 64:
                raise ValueError(f"must decode to 24 to 64 bytes of key (this one is {len(key)})")
        return value

    @property
    def secrets(self) -> list[str]:
        """All secrets in force during a rotation: each signs, any of them verifies."""
        return [self.secret] if isinstance(self.secret, str) else list(self.secret)


class SlackChannelConfig(_Section):
    channel: str


class SlackConfig(_Section):
    bot_token: str
    signing_secret: str
    api_base_url: str = "https://slack.com/api/"
    channels: dict[str, SlackChannelConfig] = Field(default_factory=dict)


class TeamsChannelConfig(_Section):
    """`[teams.channels.NAME]`: the conversation reference a card is posted into (what the
    bot saw when it was added to the team or chat: `activity.serviceUrl`, `conversation.id`,
    the tenant)."""

    service_url: Annotated[str, Field(pattern=r"^https?://")]
    conversation_id: Annotated[str, Field(min_length=1)]
    tenant_id: str | None = None


class TeamsConfig(_Section):
    """`[teams]`: the bot's Entra ID app registration (Azure Bot resource) and its channels.

    Without `app_id` the bot runs in the Agents SDK's anonymous mode (no token on outbound
    calls, unsigned activities accepted): only for a local emulator or tests, so it must be
    asked for with `allow_anonymous = true`.
    """

    app_id: str | None = None
    app_password: str | None = None
    tenant_id: str | None = None
    allow_anonymous: bool = False
    channels: dict[str, TeamsChannelConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _credentials(self) -> TeamsConfig:
        if self.app_id is None:
            if not self.allow_anonymous:
                raise ValueError(
                    "needs app_id and app_password (or allow_anonymous = true, for a local"
                    " emulator only: unsigned activities are then accepted)"
                )
        elif not self.app_password:
            raise ValueError("app_id needs app_password (the bot's client secret)")
        return self

    @property
    def anonymous(self) -> bool:
        return self.app_id is None


class EmailListConfig(_Section):
    to: list[str]
    unmapped_may_decide: bool = False  # may an address that is no approver's decide by link?


class EmailConfig(_Section):
    smtp_url: str = "smtp://localhost:1025"
    from_: str = Field(alias="from", default="approvals@localhost")
    public_url: str = "http://127.0.0.1:8000"
    starttls: bool = False
    username: str | None = None
    password: str | None = None
    allow_plaintext_auth: bool = False  # let username/password go to a server without TLS
    link_ttl_s: Annotated[float, Field(gt=0)] = 86400.0
    link_secret: str | None = None  # signs email links; else APPROVAL_BROKER_LINK_SECRET
    lists: dict[str, EmailListConfig] = Field(default_factory=dict)


class ApproverConfig(_Section):
    token_sha256: str | None = None
    roles: list[str] = Field(default_factory=list)
    slack_user_id: str | None = None
    teams_user_id: str | None = None  # the person's Entra ID (AAD) object id
    email: str | None = None
    telegram_user_id: int | None = None
    discord_user_id: str | None = None

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


class AgentConfig(_Section):
    path: str = Field(description="import path of the pydantic-ai Agent, 'package.module:name'")
    deps: str | None = Field(default=None, description="import path of a deps factory")
    queue: str = DEFAULT_QUEUE
    tool_queues: dict[str, str] = Field(default_factory=dict)
    max_rounds: Annotated[int, Field(ge=1)] = 10
    # the job that paused a run waits this long for the round's outcomes (under its timeout)
    live_wait_s: Annotated[float, Field(ge=0, le=600)] = 0.0
    unanswered: Annotated[str, Field(pattern="^(reject|raise)$")] = "reject"  # on a new prompt


class McpGatewayConfig(_Section):
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


class BrokerSection(_Section):
    max_rounds: Annotated[int, Field(ge=1)] = 10
    stream_maxlen: Annotated[int, Field(ge=1000)] = 1_000_000
    retention_s: Annotated[float, Field(ge=60)] = 30 * 86400  # how long a decided request is kept
    redis_cluster: bool = False  # as APPROVAL_BROKER_REDIS_CLUSTER=1
    # appendfsync of the embedded Redis, and the least a Redis of your own is expected to run
    # (`broker.redis.durability`); APPROVAL_BROKER_REDIS_FSYNC wins when set
    redis_fsync: RedisFsync = "always"


class AuditSection(_Section):
    """`[audit]`: the tamper-evident audit trail (docs/audit.md). Off, the steps write no entry
    (what `bench/bench_audit.py` compares against); kept `retention_days`, then trimmed."""

    enabled: bool = True
    retention_days: Annotated[float, Field(ge=1)] = 365.0


class WorkersSection(_Section):
    """`[workers]`: how an `approval-broker worker` process runs agent runs."""

    concurrency: Annotated[int, Field(ge=1, le=1000)] = 50  # runs at once per worker process
    run_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 600.0  # one round of one run, at most
    loop_block_s: Annotated[float, Field(ge=0.5, le=600)] = 10.0  # sync code holding the loop
    # a killed worker process's jobs count as abandoned (and are retried) this long after its
    # last heartbeat; its heartbeats and the recovery pass run at a sixth and half of it
    abandoned_after_s: Annotated[int, Field(ge=5, le=3600)] = 30


class ReceiptsSection(_Section):
    """`[receipts]`: signed approval receipts, checked where the tool runs (docs/receipts.md)."""

    key_file: Path | None = None  # Ed25519 private key (PEM); `up` makes one in its data dir
    previous_key_files: list[Path] = Field(default_factory=list)  # rotated out, still verify
    ttl_s: Annotated[float, Field(ge=10, le=7 * 86400)] = 900.0
    recheck_roles: bool = False  # the approver's roles checked again when the tool runs


class Config(_Section):
    """The whole TOML config, checked for dangling names and escalation loops."""

    broker: BrokerSection = Field(default_factory=BrokerSection)
    workers: WorkersSection = Field(default_factory=WorkersSection)
    receipts: ReceiptsSection = Field(default_factory=ReceiptsSection)
    audit: AuditSection = Field(default_factory=AuditSection)
    queues: dict[str, QueueConfig] = Field(default_factory=dict)
    webhooks: dict[str, WebhookConfig] = Field(default_factory=dict)
    slack: SlackConfig | None = None
    email: EmailConfig | None = None
    teams: TeamsConfig | None = None
    telegram: TelegramConfig | None = None
    discord: DiscordConfig | None = None
    approvers: dict[str, ApproverConfig] = Field(default_factory=dict)
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    mcp_gateways: dict[str, McpGatewayConfig] = Field(default_factory=dict)
    rules: list[Any] = Field(
        default_factory=list,
        description="[[rules]]: the operator's policy rules (checked by broker.domain.rules.config_rules)",
    )

    @model_validator(mode="after")
    def _check_references(self) -> Config:
        self.queues.setdefault(DEFAULT_QUEUE, QueueConfig())
        for name, queue in self.queues.items():
            for i, channel in enumerate(queue.channels):
                problem = self.channel_problem(channel)
                if problem:
                    raise ValueError(f"queues.{name}.channels[{i}]: {problem}")
            if queue.escalate_to is not None and queue.escalate_to not in self.queues:
                raise ValueError(
                    f"queues.{name}.escalate_to: queue {queue.escalate_to!r} is not defined"
                )
        known = self.known_roles()
        for name, queue in self.queues.items():
            for i, role in enumerate(queue.roles):
                if role not in known:
                    raise ValueError(
                        f"queues.{name}.roles[{i}]: role {role!r} is held by no approver or"
                        " webhook endpoint"
                    )
        for name in self.queues:
            seen = [name]
            nxt = self.queues[name].escalate_to
            while nxt is not None:
                if nxt in seen:
                    chain = " -> ".join([*seen, nxt])
                    raise ValueError(f"queues.{name}.escalate_to: escalation loops: {chain}")
                seen.append(nxt)
                nxt = self.queues[nxt].escalate_to
        self._check_one_person_per_identity()
        for name, agent in self.agents.items():
            for key, queue_name in [("queue", agent.queue), *agent.tool_queues.items()]:
                if queue_name not in self.queues:
                    where = "queue" if key == "queue" else f"tool_queues.{key}"
                    raise ValueError(f"agents.{name}.{where}: queue {queue_name!r} is not defined")
        return self

    def _check_one_person_per_identity(self) -> None:
        """Two approvers never share a name (after normalisation), a Slack, Teams, Telegram or
        Discord user or an email address: each is one person, whose vote counts once
        (`broker.domain.persons`)."""
        seen: dict[tuple[str, str], str] = {}
        for name, approver in self.approvers.items():
            for key, value in (
                ("name", normal_name(name)),
                ("slack_user_id", approver.slack_user_id),
                (
                    "teams_user_id",
                    approver.teams_user_id.casefold() if approver.teams_user_id else None,
                ),
                ("telegram_user_id", str(approver.telegram_user_id or "") or None),
                ("discord_user_id", approver.discord_user_id),
                ("email", normal_address(approver.email) if approver.email else None),
            ):
                if not value:
                    continue
                other = seen.setdefault((key, value), name)
                if other != name:
                    where = f"approvers.{name}" if key == "name" else f"approvers.{name}.{key}"
                    raise ValueError(
                        f"{where}: approver {other!r} has the same {key.replace('_', ' ')};"
                        " one person is one approver"
                    )

    def decides_through(self, channel: str) -> bool:
        """Whether replies through `channel` may decide: not a notify-only webhook endpoint's."""
        kind, _, name = channel.partition(":")
        endpoint = self.webhooks.get(name) if kind == "webhook" else None
        return endpoint is None or endpoint.decides

    @model_validator(mode="after")
    def _check_mcp_gateways(self) -> Config:
        for name, gateway in self.mcp_gateways.items():
            if gateway.queue not in self.queues:
                raise ValueError(
                    f"mcp_gateways.{name}.queue: queue {gateway.queue!r} is not defined"
                )
        return self

    def channel_problem(self, channel: str) -> str | None:
        """Why a channel name such as 'slack:approvals' points at nothing, or None if it is fine."""
        kind, _, name = channel.partition(":")
        if kind not in CHANNEL_KINDS:
            return f"unknown channel kind {kind!r} in {channel!r} (use one of {CHANNEL_KINDS})"
        if kind == "inbox":
            return None if not name else f"'inbox' takes no name, got {channel!r}"
        if not name:
            return f"{channel!r} needs a name, as in '{kind}:NAME'"
        if kind == "webhook" and name not in self.webhooks:
            return f"webhook {name!r} is not defined under [webhooks.{name}]"
        if kind == "slack" and (self.slack is None or name not in self.slack.channels):
            return f"slack channel {name!r} is not defined under [slack.channels.{name}]"
        if kind == "teams" and (self.teams is None or name not in self.teams.channels):
            return f"teams channel {name!r} is not defined under [teams.channels.{name}]"
        if kind == "telegram" and (self.telegram is None or name not in self.telegram.chats):
            return f"telegram chat {name!r} is not defined under [telegram.chats.{name}]"
        if kind == "discord" and (self.discord is None or name not in self.discord.channels):
            return f"discord channel {name!r} is not defined under [discord.channels.{name}]"
        if kind == "email" and (self.email is None or name not in self.email.lists):
            return f"email list {name!r} is not defined under [email.lists.{name}]"
        return None

    def known_roles(self) -> set[str]:
        """Every role some approver or webhook endpoint holds: the roles a request may name."""
        held = [a.roles for a in self.approvers.values()] + [
            w.roles for w in self.webhooks.values()
        ]
        return {role for roles in held for role in roles}

    def queue_roles(self, queue: str) -> list[str]:
        q = self.queues.get(queue)
        return q.roles if q else []

    def escalation_target(self, queue: str) -> str | None:
        q = self.queues.get(queue)
        return q.escalate_to if q else None

    def timeout_for(self, queue: str) -> float:
        q = self.queues.get(queue)
        return q.timeout_s if q else DEFAULT_TIMEOUT_S

    def quorum_for(self, queue: str) -> int:
        q = self.queues.get(queue)
        return q.quorum if q else 1

    def ack_timeout_for(self, queue: str) -> float:
        q = self.queues.get(queue)
        return q.ack_timeout_s if q else DEFAULT_ACK_TIMEOUT_S


def _resolve_secrets(raw: dict[str, Any]) -> None:
    """Replace every `env:NAME` string value under the secret-bearing sections, in place."""

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{path}.{k}" if path else k) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        if isinstance(node, str):
            return resolve_secret(node, path)
        return node

    for section in ("webhooks", "slack", "email", "teams", "approvers", "telegram", "discord"):
        if section in raw:
            raw[section] = walk(raw[section], section)


def _format_validation_error(exc: ValidationError, source: str) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    return f"{source}: {where + ': ' if where else ''}{msg}"


def parse_config(raw: dict[str, Any], source: str = "config") -> Config:
    _resolve_secrets(raw)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None
    # [[rules]] are checked here so a bad one stops every role at start, naming the key. The
    # check needs no config module; its package's other modules (the rule store) do, hence the
    # import at call time.
    from broker.domain.rules.config_rules import parse_config_rules

    parse_config_rules(config.rules, config, source)
    return config


def load_config(path: Path | str | None) -> Config:
    """Read and check a TOML config; no path means the defaults (one `default` queue, inbox only)."""
    if path is None:
        return parse_config({})
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read it ({exc.strerror})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path}: not valid TOML: {exc}") from None
    return parse_config(raw, f"config {path}")
