"""The web inbox at `/`: every request waits there for whoever may decide it; people decide
with their bearer token over REST. Nothing to send (the page follows `/v1/events`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.plugin import ChannelPlugin

if TYPE_CHECKING:
    from fastapi import APIRouter

    from channels.outbound import OutboundHost
    from channels.sender import Sender


class InboxPlugin(ChannelPlugin):
    kind = "inbox"
    bare = True
    always_on = True

    def routes(self) -> APIRouter:
        from channels.inbox.routes import router

        return router

    def sender(self, name: str, host: OutboundHost) -> Sender:
        from channels.inbox.sender import InboxSender

        return InboxSender()


plugin = InboxPlugin()
