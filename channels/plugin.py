"""The one protocol every channel kind implements, as a base class with the defaults.

A kind's `channels/<kind>/__init__.py` makes one `ChannelPlugin` (`plugin`) and names it in
pyproject.toml's `approval_broker.channels` entry points; that is the whole registration. The
core asks it for its config section (`broker.domain.channel_kinds.ChannelKind`); the API for its
inbound routes (`routes`), the notifier for a sender per channel (`sender`). Both factories
import the kind's heavy modules (platform SDKs, FastAPI routes) when first called, so
`__init__.py` stays light: a process loads a platform's code only if the config uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.util import find_spec
from typing import TYPE_CHECKING, ClassVar

from broker.domain.channel_kinds import ChannelSection
from broker.domain.config import Config
from broker.domain.settings import Settings

if TYPE_CHECKING:
    from fastapi import APIRouter
    from starlette.types import ASGIApp

    from channels.outbound import OutboundHost
    from channels.sender import Sender


class ChannelPlugin:
    """A channel kind: its config, its inbound routes and its senders (defaults: none)."""

    kind: ClassVar[str]
    section_key: ClassVar[str | None] = None
    section: ClassVar[type[ChannelSection] | None] = None
    bare: ClassVar[bool] = False
    approver_field: ClassVar[str | None] = None
    approver_field_type: ClassVar[type] = str
    person_facing: ClassVar[bool] = True
    extra: ClassVar[str | None] = None
    """The package extra that brings its dependencies (`teams`: `approval-broker[teams]`)."""
    extra_modules: ClassVar[tuple[str, ...]] = ()
    """Modules the kind's extra brings; one missing means the extra is not installed."""
    route_prefix: ClassVar[str | None] = None
    """Where its inbound routes live (`/v1/slack`): answered `404 not_configured` while the
    kind is not configured, without loading its code."""
    pages: ClassVar[bool] = False
    """True: its routes are pages people open in a browser, so errors come as HTML too."""
    always_on: ClassVar[bool] = False
    """True: its routes and senders exist even without a section (the inbox)."""

    def prepare(self, settings: Settings, config: Config) -> None:
        """Before a role that serves the kind starts (the API, a notifier, `up`): make what it
        needs that a config can't say, or refuse with a ConfigError (e.g. a signing secret the
        roles share through the data directory)."""
        return None

    def check(self, config: Config) -> None:
        """What only the kind's senders need of the config, checked before a notifier
        connects anywhere: raise ConfigError naming the key."""
        return None

    @property
    def title(self) -> str:
        """The kind's name as a person writes it (`Teams`), for messages."""
        return self.kind.capitalize()

    def missing_dependency(self) -> str | None:
        for module in self.extra_modules:
            if find_spec(module) is None:
                return module
        return None

    def routes(self) -> APIRouter | None:
        """Its inbound routes (replies, clicks, pages), or None: it takes no replies. They reach
        the host app's services through `channels.inbound.Host`."""
        return None

    def middleware(self) -> list[Callable[..., ASGIApp]]:
        """ASGI middleware the kind's routes need around them (e.g. headers on its pages)."""
        return []

    def sender(self, name: str, host: OutboundHost) -> Sender:
        """What delivers events to the channel `name` (`slack:approvals`)."""
        raise NotImplementedError(f"channel kind {self.kind!r} delivers nothing")

    def __repr__(self) -> str:
        return f"<channel kind {self.kind}>"
