"""Telegram: a card (text and inline buttons) per request in each chat, edited in place; the
bot's webhook (`POST /v1/telegram/updates`, secret-token header) brings clicks and reasons."""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.plugin import ChannelPlugin
from channels.telegram.config import TelegramConfig, telegram_section

if TYPE_CHECKING:
    from fastapi import APIRouter

    from channels.outbound import OutboundHost
    from channels.sender import Sender

CALL_TIMEOUT_S = 10.0


class TelegramPlugin(ChannelPlugin):
    kind = "telegram"
    section_key = "telegram"
    section = TelegramConfig
    approver_field = "telegram_user_id"
    approver_field_type = int
    route_prefix = "/v1/telegram"

    def routes(self) -> APIRouter:
        from channels.telegram.routes import router

        return router

    def sender(self, name: str, host: OutboundHost) -> Sender:
        from channels.cards.sender import card_settings
        from channels.telegram.sender import TelegramSender, telegram_client

        telegram = telegram_section(host.config)
        assert telegram is not None, "the config names a telegram chat only with [telegram]"
        timeout = host.timeout_s("chat", CALL_TIMEOUT_S)
        return TelegramSender(
            name,
            telegram.chats[name.partition(":")[2]].chat_id,
            client=host.shared("telegram", lambda: telegram_client(telegram, timeout)),
            **card_settings(host, timeout),
        )


plugin = TelegramPlugin()
