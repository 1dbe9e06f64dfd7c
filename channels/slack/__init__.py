"""Slack: a Block Kit message per request in each channel, updated in place; replies come as
interactions (`POST /v1/slack/interactions`, v0 signatures). docs/channels.md says how to set
up the app (the manifest in deploy/slack/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.plugin import ChannelPlugin
from channels.slack.config import SlackConfig, slack_section

if TYPE_CHECKING:
    from fastapi import APIRouter

    from channels.outbound import OutboundHost
    from channels.sender import Sender

CALL_TIMEOUT_S = 15.0


class SlackPlugin(ChannelPlugin):
    kind = "slack"
    section_key = "slack"
    section = SlackConfig
    approver_field = "slack_user_id"
    route_prefix = "/v1/slack"

    def routes(self) -> APIRouter:
        from channels.slack.routes import router

        return router

    def sender(self, name: str, host: OutboundHost) -> Sender:
        from channels.copies import claim_stale_s
        from channels.slack.sender import SlackSender, slack_client

        slack = slack_section(host.config)
        assert slack is not None, "the config names a slack channel only with [slack]"
        timeout = host.timeout_s("slack", CALL_TIMEOUT_S)
        return SlackSender(
            name,
            slack.channels[name.partition(":")[2]].channel,
            client=host.shared("slack", lambda: slack_client(slack, timeout)),
            broker=host.broker,
            config=host.config,
            state=host.deliveries,
            consumer=host.consumer,
            policy=host.policy,
            concurrency=min(host.threads, 4),
            claim_stale_s=claim_stale_s(host.claim_idle_s, timeout),
            timeout_s=timeout,
        )


plugin = SlackPlugin()
