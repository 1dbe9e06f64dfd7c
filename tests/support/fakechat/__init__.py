"""FakeChat: a channel kind written for the test suite only, the worked example of
docs/adding-a-channel.md.

FakeChat is a made-up chat service (`service.py`: rooms, messages with buttons, and a webhook it
signs with Standard Webhooks when someone presses a button). The kind is what a real one in
`channels/<kind>/` would be: this module defines `plugin` and stays light (pydantic only), the
sender (`sender.py`) and the inbound route (`routes.py`) are imported by the plugin's factories
when a role first needs them. A real kind names `plugin` in pyproject.toml's
`approval_broker.channels` entry points; the contract suite (tests/channels/test_contract.py)
adds this one for its own span with `broker.domain.channel_kinds.registered(plugin)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.plugin import ChannelPlugin
from tests.support.fakechat.config import FakeChatConfig, fakechat_section

if TYPE_CHECKING:
    from fastapi import APIRouter

    from channels.outbound import OutboundHost
    from channels.sender import Sender

KIND = "fakechat"
CALL_TIMEOUT_S = 10.0


class FakeChatPlugin(ChannelPlugin):
    kind = KIND
    section_key = "fakechat"  # the config's [fakechat] table
    section = FakeChatConfig
    approver_field = "fakechat_user_id"  # [approvers.NAME] fakechat_user_id = "..."
    route_prefix = "/v1/fakechat"  # answered 404 not_configured while [fakechat] is absent

    def routes(self) -> APIRouter:
        from tests.support.fakechat.routes import router

        return router

    def sender(self, name: str, host: OutboundHost) -> Sender:
        from channels.cards.sender import card_settings
        from tests.support.fakechat.sender import FakeChatSender, fakechat_client

        section = fakechat_section(host.config)
        assert section is not None, "the config names a fakechat room only with [fakechat]"
        timeout = host.timeout_s("chat", CALL_TIMEOUT_S)
        return FakeChatSender(
            name,
            section.rooms[name.partition(":")[2]].room,
            client=host.shared(KIND, lambda: fakechat_client(section, timeout)),
            **card_settings(host, timeout),
        )


plugin = FakeChatPlugin()
