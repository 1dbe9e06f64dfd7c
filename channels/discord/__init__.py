"""Discord: a message with buttons per request in each channel, edited in place; the
interactions endpoint (`POST /v1/discord/interactions`, Ed25519 signatures) brings clicks and
the reject reason's modal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.discord.config import DiscordConfig, discord_section
from channels.plugin import ChannelPlugin

if TYPE_CHECKING:
    from fastapi import APIRouter

    from channels.outbound import OutboundHost
    from channels.sender import Sender

CALL_TIMEOUT_S = 10.0


class DiscordPlugin(ChannelPlugin):
    kind = "discord"
    section_key = "discord"
    section = DiscordConfig
    approver_field = "discord_user_id"
    route_prefix = "/v1/discord"

    def routes(self) -> APIRouter:
        from channels.discord.routes import router

        return router

    def sender(self, name: str, host: OutboundHost) -> Sender:
        from channels.cards.sender import card_settings
        from channels.discord.sender import DiscordSender, discord_client

        discord = discord_section(host.config)
        assert discord is not None, "the config names a discord channel only with [discord]"
        timeout = host.timeout_s("chat", CALL_TIMEOUT_S)
        return DiscordSender(
            name,
            discord.channels[name.partition(":")[2]].channel_id,
            client=host.shared("discord", lambda: discord_client(discord, timeout)),
            **card_settings(host, timeout),
        )


plugin = DiscordPlugin()
