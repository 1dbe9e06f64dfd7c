"""`[telegram]`: a bot (Bot API over HTTPS) and the chats it posts requests into."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.channel_kinds import ChannelSection
from broker.domain.config import Config


class TelegramChatConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chat_id: int | str  # a chat's numeric id, or "@channelusername"


class TelegramConfig(ChannelSection):
    names_key: ClassVar[str] = "chats"
    label: ClassVar[str] = "telegram chat"
    table: ClassVar[str] = "telegram.chats"

    bot_token: str
    webhook_secret: Annotated[
        str, Field(min_length=16, max_length=256, pattern=r"^[A-Za-z0-9_-]+$")
    ]
    """What Telegram sends as `X-Telegram-Bot-Api-Secret-Token` (setWebhook's `secret_token`:
    1-256 characters of A-Z, a-z, 0-9, _ and -; at least 16 here, as it is the only proof)."""
    api_base_url: str = "https://api.telegram.org"
    chats: dict[str, TelegramChatConfig] = Field(default_factory=dict)

    def describe(self, name: str) -> str:
        found = self.chats.get(name)
        return f"posts into chat {found.chat_id}" if found else ""


def telegram_section(config: Config) -> TelegramConfig | None:
    """The config's `[telegram]`, or None."""
    section = config.section("telegram")
    return section if isinstance(section, TelegramConfig) else None
