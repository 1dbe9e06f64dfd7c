"""The TOML config named by APPROVAL_BROKER_CONFIG, put together and checked as a whole.

A config is checked as a whole when it is loaded, so a fleet never starts with a queue that
routes to nowhere or an escalation chain that loops. The core's sections are
`broker.domain.config_sections`'; each channel kind's section (`[slack]`, `[webhooks.NAME]`) is
parsed by the model the kind declares (`broker.domain.channel_kinds`), so the core names no
channel kind and a new kind needs no line here.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    SkipValidation,
    ValidationError,
    model_serializer,
    model_validator,
)

from broker.domain import channel_kinds
from broker.domain.channel_kinds import ChannelSection
from broker.domain.config_errors import did_you_mean, error_line, not_defined
from broker.domain.config_sections import (
    DEFAULT_ACK_TIMEOUT_S,
    DEFAULT_QUEUE,
    DEFAULT_TIMEOUT_S,
    AgentConfig,
    ApproverConfig,
    AuditSection,
    BrokerSection,
    McpGatewayConfig,
    QueueConfig,
    ReceiptsSection,
    Section,
    WorkersSection,
)
from broker.domain.errors import ConfigError
from broker.domain.persons import normal_name

SECTIONS_FIELD = "channel_sections"
SPECIAL_ROLES = ("admin", "auditor", "policy", "requester", "*")
"""Roles the broker itself gives a meaning (`broker.domain.principals`, rules' `policy`)."""
ROLE_TYPO = 0.8
"""How alike an unused role must be to a used one to be refused as its typo (difflib ratio:
`requestor`/`requester` 0.89; `ops1`/`ops2` 0.75 are two roles)."""
CALLBACK_KIND = "webhook"
"""A request's `callback` names an endpoint of this kind (contract: POST /v1/requests)."""


def resolve_secret(value: str | None, key: str, source: str = "config") -> str | None:
    """Turn `env:NAME` into the value of that environment variable; refuse a missing one,
    naming the file (`source`) and the key."""
    if value is None or not value.startswith("env:"):
        return value
    name = value[4:]
    if name not in os.environ:
        raise ConfigError(f"{source}: {key} names environment variable {name}, which is not set")
    return os.environ[name]


class Config(Section):
    """The whole TOML config, checked for dangling names and escalation loops."""

    broker: BrokerSection = Field(default_factory=BrokerSection)
    workers: WorkersSection = Field(default_factory=WorkersSection)
    receipts: ReceiptsSection = Field(default_factory=ReceiptsSection)
    audit: AuditSection = Field(default_factory=AuditSection)
    queues: dict[str, QueueConfig] = Field(default_factory=dict)
    approvers: dict[str, ApproverConfig] = Field(default_factory=dict)
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    mcp_gateways: dict[str, McpGatewayConfig] = Field(default_factory=dict)
    rules: list[Any] = Field(
        default_factory=list,
        description="[[rules]]: the operator's policy rules (checked by broker.domain.rules.config_rules)",
    )
    channel_sections: SkipValidation[dict[str, ChannelSection]] = Field(
        default_factory=dict,
        exclude=True,
        description="each configured channel kind's section, parsed by its own model (by kind)",
    )

    _source: str = PrivateAttr(default="config")

    @property
    def source(self) -> str:
        """Where the config came from, as every message about it starts: `config PATH`."""
        return self._source

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
                    f"queues.{name}.escalate_to: "
                    + not_defined("queue", queue.escalate_to, sorted(self.queues))
                )
        known = self.known_roles()
        for name, queue in self.queues.items():
            for i, role in enumerate(queue.roles):
                if role not in known:
                    guess = did_you_mean(role, known)
                    raise ValueError(
                        f"queues.{name}.roles[{i}]: role {role!r} is held by no approver or"
                        " webhook endpoint" + (f" (did you mean {guess!r}?)" if guess else "")
                    )
        self._check_held_roles()
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
                    raise ValueError(
                        f"agents.{name}.{where}: "
                        + not_defined("queue", queue_name, sorted(self.queues))
                    )
        for name, gateway in self.mcp_gateways.items():
            if gateway.queue not in self.queues:
                raise ValueError(
                    f"mcp_gateways.{name}.queue: "
                    + not_defined("queue", gateway.queue, sorted(self.queues))
                )
        return self

    def _check_held_roles(self) -> None:
        """A role an approver or endpoint holds that nothing uses and that is one letter or two
        from a role that is used (`requestor` for `requester`) is a typo that would quietly
        deny: refused, naming the likely one. A role no queue uses but unlike any is fine: a
        tool's `allowed_roles` may name it."""
        used = {*SPECIAL_ROLES, *(role for q in self.queues.values() for role in q.roles)}
        held = [
            (f"approvers.{name}.roles", approver.roles) for name, approver in self.approvers.items()
        ]
        for section in self.channel_sections.values():
            held += [
                (f"{section.table}.{name}.roles", section.roles_of(name))
                for name in section.channel_names()
            ]
        for where, roles in held:
            for i, role in enumerate(roles):
                guess = None if role in used else did_you_mean(role, used, cutoff=ROLE_TYPO)
                if guess is not None:
                    raise ValueError(
                        f"{where}[{i}]: role {role!r} is used by no queue, rule or channel"
                        f" (did you mean {guess!r}?)"
                    )

    def _check_one_person_per_identity(self) -> None:
        """Two approvers never share a name (after normalisation), nor a value of one approver
        field (a Slack, Teams, Telegram or Discord user, an email address): each is one person,
        whose vote counts once (`broker.domain.persons`)."""
        seen: dict[tuple[str, str], str] = {}
        for name, approver in self.approvers.items():
            for key, value in [("name", normal_name(name)), *approver.identities.items()]:
                other = seen.setdefault((key, value.strip().casefold()), name)
                if other != name:
                    where = f"approvers.{name}" if key == "name" else f"approvers.{name}.{key}"
                    raise ValueError(
                        f"{where}: approver {other!r} has the same {key.replace('_', ' ')};"
                        " one person is one approver"
                    )

    @model_serializer(mode="wrap")
    def _with_sections(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        """Dumped as the TOML file's tables: each channel kind's section under its key."""
        data: dict[str, Any] = handler(self)
        for name, section in self.channel_sections.items():
            kind = channel_kinds.kind(name)
            if kind is not None and kind.section_key:
                data[kind.section_key] = section.to_toml(by_alias=info.by_alias, mode=info.mode)
        return data

    # ---- channel kinds' sections ----------------------------------------------------------

    def section(self, kind: str) -> ChannelSection | None:
        """The configured section of channel kind `kind` (`[slack]`), or None."""
        return self.channel_sections.get(kind)

    def channel_problem(self, channel: str) -> str | None:
        """Why a channel name such as 'slack:approvals' points at nothing, or None if it is fine."""
        kind_name, _, name = channel.partition(":")
        kind = channel_kinds.kind(kind_name)
        if kind is None:
            known = ", ".join(channel_kinds.names())
            return f"unknown channel kind {kind_name!r} in {channel!r} (known kinds: {known})"
        if kind.bare:
            return None if not name else f"{kind_name!r} takes no name, got {channel!r}"
        if not name:
            return f"{channel!r} needs a name, as in '{kind_name}:NAME'"
        section = self.section(kind_name)
        if section is not None and name in section.channel_names():
            return None
        model = kind.section
        label = model.label if model is not None else f"{kind_name} channel"
        table = model.table if model is not None else kind_name
        return f"{label} {name!r} is not defined under [{table}.{name}]"

    def decides_through(self, channel: str) -> bool:
        """Whether replies through `channel` may decide: not a notify-only one's."""
        kind, _, name = channel.partition(":")
        section = self.section(kind)
        return section is None or section.decides(name)

    def channel_roles(self, channel: str) -> list[str]:
        """The roles `channel` holds as a principal of its own (a webhook endpoint's)."""
        kind, _, name = channel.partition(":")
        section = self.section(kind)
        return section.roles_of(name) if section is not None else []

    def callback_channel(self, name: str) -> str:
        """The channel a request's `callback` names (`ops` -> `webhook:ops`)."""
        return f"{CALLBACK_KIND}:{name}"

    def callback_channels(self) -> list[str]:
        """Every channel a request's callback may name: each endpoint of the callback kind."""
        section = self.section(CALLBACK_KIND)
        names = section.channel_names() if section is not None else []
        return [self.callback_channel(name) for name in names]

    def known_roles(self) -> set[str]:
        """Every role some approver or channel principal holds: the roles a request may name."""
        held = {role for a in self.approvers.values() for role in a.roles}
        for section in self.channel_sections.values():
            for name in section.channel_names():
                held.update(section.roles_of(name))
        return held

    # ---- queues ---------------------------------------------------------------------------

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


def _resolve_secrets(node: Any, path: str, source: str) -> Any:
    """`node` with every `env:NAME` string replaced by that variable's value."""
    if isinstance(node, dict):
        return {
            k: _resolve_secrets(v, f"{path}.{k}" if path else k, source) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_resolve_secrets(v, f"{path}[{i}]", source) for i, v in enumerate(node)]
    if isinstance(node, str):
        return resolve_secret(node, path, source)
    return node


def top_keys() -> list[str]:
    """The keys a config file may have at its top: the core's sections and each kind's."""
    core = [k for k in Config.model_fields if k != SECTIONS_FIELD]
    kinds = [channel_kinds.kind(name) for name in channel_kinds.names()]
    return core + [k.section_key for k in kinds if k is not None and k.section_key]


def _channel_sections(raw: dict[str, Any], source: str) -> dict[str, ChannelSection]:
    """Each channel kind's section of `raw`, parsed with the kind's model (by kind); its
    secrets are resolved in `raw` as for the core's sections."""
    core = set(Config.model_fields) - {SECTIONS_FIELD}
    sections: dict[str, ChannelSection] = {}
    for key in [k for k in raw if k not in core]:
        kind = channel_kinds.by_section_key(key)
        if kind is None or kind.section is None:
            continue  # left for the core model, which names the unknown key
        raw[key] = _resolve_secrets(raw[key], key, source)
        try:
            sections[kind.kind] = kind.section.from_toml(raw[key])
        except ValidationError as exc:
            raise ConfigError(
                f"{source}: {error_line(exc, kind.section.toml_shape(), key)}"
            ) from None
    return sections


def parse_config(raw: dict[str, Any], source: str = "config") -> Config:
    """Check a config given as the TOML file's tables (secrets are resolved in `raw`)."""
    sections = _channel_sections(raw, source)
    if "approvers" in raw:
        raw["approvers"] = _resolve_secrets(raw["approvers"], "approvers", source)
    keys = {kind.section_key for k in sections if (kind := channel_kinds.kind(k)) is not None}
    core = {k: v for k, v in raw.items() if k not in keys and k != SECTIONS_FIELD}
    try:
        config = Config.model_validate({**core, SECTIONS_FIELD: sections})
    except ValidationError as exc:
        raise ConfigError(f"{source}: {error_line(exc, Config, top_keys=top_keys())}") from None
    # [[rules]] are checked here so a bad one stops every role at start, naming the key. The
    # check needs no config module; its package's other modules (the rule store) do, hence the
    # import at call time.
    from broker.domain.rules.config_rules import parse_config_rules

    parse_config_rules(config.rules, config, source)
    config._source = source
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
