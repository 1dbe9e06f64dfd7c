"""Tuning knobs of a notifier process, from APPROVAL_BROKER_NOTIFIER_* (defaults suit production)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class NotifierOptions(BaseSettings):
    """How one notifier process reads, retries and gives up; the config file says *where* to deliver."""

    model_config = SettingsConfigDict(env_prefix="APPROVAL_BROKER_NOTIFIER_", extra="allow")

    name: str | None = Field(default=None, description="consumer name (default: host-pid-random)")
    claim_idle_s: Annotated[float, Field(gt=0)] = Field(
        default=30.0, description="an entry unacknowledged this long belongs to a dead consumer"
    )
    block_ms: Annotated[int, Field(ge=10)] = 500
    batch: Annotated[int, Field(ge=1, le=10_000)] = 200
    max_inflight: Annotated[int, Field(ge=1)] = Field(
        default=1000, description="stream entries one notifier works on at once"
    )
    park_after_s: Annotated[float, Field(gt=0)] = Field(
        default=5.0,
        description="when max_inflight is full, deliveries of entries older than this are parked"
        " in Redis so their entries can be acknowledged",
    )
    max_deliveries: Annotated[int, Field(ge=1)] = Field(
        default=10, description="an entry handed out this often without an ack is dead-lettered"
    )
    workers: Annotated[int, Field(ge=1, le=256)] = Field(
        default=8, description="delivery threads per channel"
    )
    max_attempts: Annotated[int, Field(ge=1, le=50)] = Field(
        default=5,
        description=(
            "tries per Slack, Teams, Telegram, Discord or email delivery (webhooks have their own)"
        ),
    )
    backoff_s: Annotated[float, Field(gt=0)] = 1.0
    max_backoff_s: Annotated[float, Field(gt=0)] = 60.0
    shutdown_grace_s: Annotated[float, Field(ge=0)] = 10.0

    def timeout_s(self, name: str, default: float) -> float:
        """The call timeout a channel kind names `name` (`slack`, `smtp`, `chat`...): the
        setting `{name}_timeout_s` (APPROVAL_BROKER_NOTIFIER_{NAME}_TIMEOUT_S), else `default`."""
        raw = (self.model_extra or {}).get(f"{name}_timeout_s")
        if raw is None:
            return default
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{name}_timeout_s must be a number of seconds, got {raw!r}") from None
        if not value > 0:
            raise ValueError(f"{name}_timeout_s must be more than 0, got {raw!r}")
        return value
