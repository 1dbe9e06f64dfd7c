"""`[fakechat]`: the service's URL and bot token, the secret its webhooks are signed with, and
the rooms requests are posted into (`fakechat:NAME` names `[fakechat.rooms.NAME]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.channel_kinds import ChannelSection
from broker.domain.config import Config


class FakeChatRoom(BaseModel):
    model_config = ConfigDict(extra="forbid")

    room: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")


class FakeChatConfig(ChannelSection):
    names_key: ClassVar[str] = "rooms"
    label: ClassVar[str] = "fakechat room"
    table: ClassVar[str] = "fakechat.rooms"

    api_url: str = Field(pattern=r"^https?://")
    bot_token: str = Field(min_length=1)
    signing_secret: str = Field(pattern=r"^whsec_[A-Za-z0-9+/=]{32,}$")
    """The Standard Webhooks secret the service signs its webhooks with."""
    rooms: dict[str, FakeChatRoom] = Field(default_factory=dict)

    def describe(self, name: str) -> str:
        found = self.rooms.get(name)
        return f"posts into room {found.room}" if found else ""


def fakechat_section(config: Config) -> FakeChatConfig | None:
    """The config's `[fakechat]`, or None."""
    section = config.section("fakechat")
    return section if isinstance(section, FakeChatConfig) else None
