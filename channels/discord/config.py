"""`[discord]`: an application with a bot, its interactions endpoint, and its channels."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.channel_kinds import ChannelSection
from broker.domain.config import Config


class DiscordChannelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channel_id: str


class DiscordConfig(ChannelSection):
    label: ClassVar[str] = "discord channel"
    table: ClassVar[str] = "discord.channels"

    application_id: str
    public_key: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]  # Ed25519, hex
    bot_token: str
    api_base_url: str = "https://discord.com/api/v10"
    channels: dict[str, DiscordChannelConfig] = Field(default_factory=dict)

    def describe(self, name: str) -> str:
        found = self.channels.get(name)
        return f"posts into channel {found.channel_id}" if found else ""


def discord_section(config: Config) -> DiscordConfig | None:
    """The config's `[discord]`, or None."""
    section = config.section("discord")
    return section if isinstance(section, DiscordConfig) else None
