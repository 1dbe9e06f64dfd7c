"""Email: one mail per recipient of a list, with signed, single-use, expiring links; a link's
page (`GET /v1/email/{token}`) confirms and its form (`POST`) decides."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.domain.config import Config
from broker.domain.settings import Settings
from channels.email.config import EmailConfig, email_section
from channels.plugin import ChannelPlugin

if TYPE_CHECKING:
    from fastapi import APIRouter
    from starlette.types import ASGIApp

    from channels.outbound import OutboundHost
    from channels.sender import Sender

CALL_TIMEOUT_S = 30.0


class EmailPlugin(ChannelPlugin):
    kind = "email"
    section_key = "email"
    section = EmailConfig
    approver_field = "email"
    route_prefix = "/v1/email"
    pages = True

    def routes(self) -> APIRouter:
        from channels.email.routes import router

        return router

    def prepare(self, settings: Settings, config: Config) -> None:
        from channels.email.links import prepare_link_secret

        prepare_link_secret(settings, config)

    def check(self, config: Config) -> None:
        from broker.domain.errors import ConfigError
        from channels.email.sender import smtp_target

        email = email_section(config)
        if email is not None:
            try:
                smtp_target(email)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def middleware(self) -> list[Callable[..., ASGIApp]]:
        from channels.email.headers import EmailPageHeaders

        return [EmailPageHeaders]

    def sender(self, name: str, host: OutboundHost) -> Sender:
        from channels.email.sender import EmailSender

        email = email_section(host.config)
        assert email is not None, "the config names an email list only with [email]"
        return EmailSender(
            name,
            email.lists[name.partition(":")[2]].to,
            email=email,
            broker=host.broker,
            config=host.config,
            state=host.deliveries,
            policy=host.policy,
            concurrency=min(host.threads, 4),
            timeout_s=host.timeout_s("smtp", CALL_TIMEOUT_S),
        )


plugin = EmailPlugin()
