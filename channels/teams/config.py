"""`[teams]`: the bot's Entra ID app registration (Azure Bot resource) and its channels."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from broker.domain.channel_kinds import ChannelSection
from broker.domain.config import Config


class TeamsChannelConfig(BaseModel):
    """`[teams.channels.NAME]`: the conversation reference a card is posted into (what the
    bot saw when it was added to the team or chat: `activity.serviceUrl`, `conversation.id`,
    the tenant)."""

    model_config = ConfigDict(extra="forbid")

    service_url: Annotated[str, Field(pattern=r"^https?://")]
    conversation_id: Annotated[str, Field(min_length=1)]
    tenant_id: str | None = None


class TeamsConfig(ChannelSection):
    """`[teams]`: without `app_id` the bot runs in the Agents SDK's anonymous mode (no token on
    outbound calls, unsigned activities accepted): only for a local emulator or tests, so it
    must be asked for with `allow_anonymous = true`.
    """

    label: ClassVar[str] = "teams channel"
    table: ClassVar[str] = "teams.channels"

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

    def describe(self, name: str) -> str:
        found = self.channels.get(name)
        return f"posts into conversation {found.conversation_id}" if found else ""


def teams_section(config: Config) -> TeamsConfig | None:
    """The config's `[teams]`, or None."""
    section = config.section("teams")
    return section if isinstance(section, TeamsConfig) else None
