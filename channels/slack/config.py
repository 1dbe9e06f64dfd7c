"""`[slack]`: the Slack app's bot token and signing secret, and the channels it posts into."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.channel_kinds import ChannelSection
from broker.domain.config import Config


class SlackChannelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channel: str


class SlackConfig(ChannelSection):
    label: ClassVar[str] = "slack channel"
    table: ClassVar[str] = "slack.channels"

    bot_token: str
    signing_secret: str
    api_base_url: str = "https://slack.com/api/"
    channels: dict[str, SlackChannelConfig] = Field(default_factory=dict)

    def describe(self, name: str) -> str:
        found = self.channels.get(name)
        return f"posts into Slack channel {found.channel}" if found else ""


def slack_section(config: Config) -> SlackConfig | None:
    """The config's `[slack]`, or None."""
    section = config.section("slack")
    return section if isinstance(section, SlackConfig) else None
