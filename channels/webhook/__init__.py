"""Standard Webhooks: each event POSTed, signed, to an endpoint; an endpoint that `decides`
replies with a signed decision (`POST /v1/webhooks/{name}/replies`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.plugin import ChannelPlugin
from channels.webhook.config import WebhooksSection, webhook_endpoints

if TYPE_CHECKING:
    from fastapi import APIRouter

    from channels.outbound import OutboundHost
    from channels.sender import Sender


class WebhookPlugin(ChannelPlugin):
    kind = "webhook"
    section_key = "webhooks"
    section = WebhooksSection
    person_facing = False
    route_prefix = "/v1/webhooks"

    def routes(self) -> APIRouter:
        from channels.webhook.routes import router

        return router

    def sender(self, name: str, host: OutboundHost) -> Sender:
        from channels.webhook.sender import WebhookSender

        endpoint = webhook_endpoints(host.config)[name.partition(":")[2]]
        return WebhookSender(name, endpoint, host.deliveries, concurrency=host.threads)


plugin = WebhookPlugin()
