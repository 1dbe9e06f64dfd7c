"""`[email]`: the SMTP server, where links in mail point, and the lists mail goes to."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from broker.domain.channel_kinds import ChannelSection
from broker.domain.config import Config


class EmailListConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: list[str]
    unmapped_may_decide: bool = False  # may an address that is no approver's decide by link?


class EmailConfig(ChannelSection):
    names_key: ClassVar[str] = "lists"
    label: ClassVar[str] = "email list"
    table: ClassVar[str] = "email.lists"

    smtp_url: str = "smtp://localhost:1025"
    from_: str = Field(alias="from", default="approvals@localhost")
    public_url: str = "http://127.0.0.1:8000"
    starttls: bool = False
    username: str | None = None
    password: str | None = None
    allow_plaintext_auth: bool = False  # let username/password go to a server without TLS
    link_ttl_s: Annotated[float, Field(gt=0)] = 86400.0
    link_secret: str | None = None  # signs email links; else APPROVAL_BROKER_LINK_SECRET
    lists: dict[str, EmailListConfig] = Field(default_factory=dict)

    def describe(self, name: str) -> str:
        found = self.lists.get(name)
        return f"mails {', '.join(found.to) or 'no one'}" if found else ""


def email_section(config: Config) -> EmailConfig | None:
    """The config's `[email]`, or None."""
    section = config.section("email")
    return section if isinstance(section, EmailConfig) else None
