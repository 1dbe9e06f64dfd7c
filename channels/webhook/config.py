"""`[webhooks.NAME]`: Standard Webhooks endpoints, each a destination and, when it `decides`,
a principal whose signed replies decide requests."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from broker.domain.channel_kinds import ChannelSection
from broker.domain.config import Config

WEBHOOK_EVENT_TYPES = (
    "approval.requested",
    "approval.decided",
    "approval.escalated",
    "approval.timed_out",
    "approval.voted",
)
"""The event types a webhook endpoint is sent (an ack is only for channels that keep copies)."""


class WebhookConfig(BaseModel):
    """`[webhooks.NAME]`: one endpoint (Standard Webhooks); replies it signs come from
    `webhook:NAME`, a principal with `roles`."""

    model_config = ConfigDict(extra="forbid")

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


_ENDPOINTS = TypeAdapter(dict[str, WebhookConfig])


class WebhooksSection(ChannelSection):
    """All `[webhooks.NAME]` tables: the section is the table of endpoints itself."""

    label: ClassVar[str] = "webhook"
    table: ClassVar[str] = "webhooks"
    names_key: ClassVar[str] = "endpoints"

    endpoints: dict[str, WebhookConfig] = Field(default_factory=dict)

    @classmethod
    def from_toml(cls, value: Any) -> WebhooksSection:
        return cls(endpoints=_ENDPOINTS.validate_python(value))

    @classmethod
    def toml_shape(cls) -> Any:
        return dict[str, WebhookConfig]

    def to_toml(self, *, by_alias: bool | None = None, mode: str = "python") -> Any:
        return {
            name: endpoint.model_dump(by_alias=bool(by_alias), mode=mode)
            for name, endpoint in self.endpoints.items()
        }

    def describe(self, name: str) -> str:
        endpoint = self.endpoints.get(name)
        return f"posts to {endpoint.url}" if endpoint is not None else ""

    def decides(self, name: str) -> bool:
        endpoint = self.endpoints.get(name)
        return endpoint is None or endpoint.decides

    def roles_of(self, name: str) -> list[str]:
        endpoint = self.endpoints.get(name)
        return list(endpoint.roles) if endpoint is not None else []


def webhook_endpoints(config: Config) -> dict[str, WebhookConfig]:
    """The config's webhook endpoints by name ({} when none)."""
    section = config.section("webhook")
    return section.endpoints if isinstance(section, WebhooksSection) else {}
