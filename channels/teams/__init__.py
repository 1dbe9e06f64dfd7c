"""Microsoft Teams: an Adaptive Card per request in each conversation, updated in place;
clicks come as `adaptiveCard/action` invokes (`POST /v1/teams/messages`, Bot Framework
tokens). Needs the Microsoft 365 Agents SDK (`approval-broker[teams]`), loaded only when a
config has `[teams]`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.plugin import ChannelPlugin
from channels.teams.config import TeamsConfig, teams_section

if TYPE_CHECKING:
    from fastapi import APIRouter

    from channels.outbound import OutboundHost
    from channels.sender import Sender

CALL_TIMEOUT_S = 15.0


class TeamsPlugin(ChannelPlugin):
    kind = "teams"
    section_key = "teams"
    section = TeamsConfig
    approver_field = "teams_user_id"
    route_prefix = "/v1/teams"
    extra = "teams"
    extra_modules = ("microsoft_agents", "aiohttp")

    def routes(self) -> APIRouter:
        from channels.teams.routes import router

        return router

    def sender(self, name: str, host: OutboundHost) -> Sender:
        from channels.copies import claim_stale_s
        from channels.teams.sender import TeamsCalls, TeamsSender

        teams = teams_section(host.config)
        assert teams is not None, "the config names a teams channel only with [teams]"
        timeout = host.timeout_s("teams", CALL_TIMEOUT_S)
        return TeamsSender(
            name,
            teams.channels[name.partition(":")[2]],
            calls=host.shared("teams", lambda: TeamsCalls(teams, timeout)),
            broker=host.broker,
            config=host.config,
            state=host.deliveries,
            consumer=host.consumer,
            policy=host.policy,
            concurrency=min(host.threads, 4),
            claim_stale_s=claim_stale_s(host.claim_idle_s, timeout),
        )


plugin = TeamsPlugin()
