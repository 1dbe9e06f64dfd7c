"""`[telegram]` and `[discord]`: the two chat platforms' sections of the config
(`broker.domain.config` checks the channel names that point into them).

Kept apart from `broker.domain.config` for size; shapes only, no checks across sections.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TelegramChatConfig(_Section):
    chat_id: int | str  # a chat's numeric id, or "@channelusername"


class TelegramConfig(_Section):
    """`[telegram]`: a bot (Bot API over HTTPS) and the chats it posts requests into."""

    bot_token: str
    webhook_secret: Annotated[
        str, Field(min_length=16, max_length=256, pattern=r"^[A-Za-z0-9_-]+$")
    ]
    """What Telegram sends as `X-Telegram-Bot-Api-Secret-Token` (setWebhook's `secret_token`:
    1-256 characters of A-Z, a-z, 0-9, _ and -; at least 16 here, as it is the only proof)."""
    api_base_url: str = "https://api.telegram.org"
    chats: dict[str, TelegramChatConfig] = Field(default_factory=dict)


class DiscordChannelConfig(_Section):
    channel_id: str


class DiscordConfig(_Section):
    """`[discord]`: an application with a bot, its interactions endpoint, and its channels."""

    application_id: str
    public_key: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]  # Ed25519, hex
    bot_token: str
    api_base_url: str = "https://discord.com/api/v10"
    channels: dict[str, DiscordChannelConfig] = Field(default_factory=dict)
