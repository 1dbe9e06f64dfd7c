"""Channel kinds are plugins: what the core knows of them, and where it finds them.

A kind (`slack`, `email`, `webhook`, ...) is a package that declares an entry point in the
group `approval_broker.channels` (pyproject.toml: `slack = "channels.slack:plugin"`); the
object it names describes the kind. The core names no kind: it finds them here, lazily and
once, and asks each only what config parsing and the judge need (its TOML section, how its
channels are named, which approver field says who a person is there). What a kind does with
HTTP and platforms is the `channels` package's (`channels.plugin.ChannelPlugin`), never the
core's. `register` adds a kind at run time (a test's fake chat service, an embedding app).

Never imports a channel: a plugin is loaded only when its entry point is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from broker.domain.errors import ConfigError

GROUP = "approval_broker.channels"
"""The entry-point group a channel kind registers under."""


class ChannelSection(BaseModel):
    """A kind's TOML section (`[slack]`, `[webhooks.NAME]`...): the base every section model
    extends. The core reads it through these methods only; the rest is the kind's."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    names_key: ClassVar[str] = "channels"
    """The table under the section that names the channels (`[slack.channels.NAME]`)."""
    label: ClassVar[str] = "channel"
    """What one of its channels is called in an error (`"slack channel"`, `"email list"`)."""
    table: ClassVar[str] = ""
    """Where a channel is defined, less its name (`"slack.channels"` for `[slack.channels.X]`)."""

    @classmethod
    def from_toml(cls, value: Any) -> ChannelSection:
        """The section from its TOML table (a section kept as a bare table overrides this)."""
        return cls.model_validate(value)

    @classmethod
    def toml_shape(cls) -> Any:
        """The type the TOML table is validated as (`from_toml`): the model, or what a
        section kept as a bare table validates (`dict[str, Endpoint]`). Errors are read
        against it (`broker.domain.config_errors`)."""
        return cls

    def to_toml(self, *, by_alias: bool | None = None, mode: str = "python") -> Any:
        """The section as its TOML table (`Config.model_dump` writes it under its key)."""
        return self.model_dump(by_alias=bool(by_alias), mode=mode)

    def channel_names(self) -> list[str]:
        """The NAMEs of the channels `KIND:NAME` this section defines."""
        names = getattr(self, self.names_key, None)
        return list(names) if isinstance(names, Mapping) else []

    def describe(self, name: str) -> str:
        """Where `KIND:NAME` goes, in a few words (`config check` prints it); "" for nothing."""
        return ""

    def decides(self, name: str) -> bool:
        """Whether replies through `KIND:NAME` may decide (False: notify only)."""
        return True

    def roles_of(self, name: str) -> list[str]:
        """The roles `KIND:NAME` holds as a principal of its own (a webhook endpoint's)."""
        return []


@runtime_checkable
class ChannelKind(Protocol):
    """What the core asks of a channel kind (the `channels` package's plugins say more)."""

    kind: str
    section_key: str | None
    """The top-level TOML key of its section (`"webhooks"` for kind `webhook`); None: none."""
    section: type[ChannelSection] | None
    bare: bool
    """True: the channel is named by the kind alone (`inbox`), never `KIND:NAME`."""
    approver_field: str | None
    """The approver key naming a person on this kind (`slack_user_id`, `email`); None: none."""
    approver_field_type: type
    person_facing: bool
    """A person reads it: skipped for a request a rule decided before anyone was asked."""
    extra: str | None
    """The package extra that brings its dependencies (`approval-broker[teams]`); None: base."""

    def missing_dependency(self) -> str | None:
        """The first module its extra would bring that can't be imported, else None."""
        ...


_added: dict[str, ChannelKind] = {}


@cache
def _declared() -> dict[str, Any]:
    """The entry points of the group, by name (read once; loading each is `kinds`' job)."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


@cache
def _loaded(name: str) -> ChannelKind:
    plugin = _declared()[name].load()
    if not isinstance(plugin, ChannelKind) or plugin.kind != name:
        raise ConfigError(f"channel kind {name!r}: its entry point names no plugin of that kind")
    return plugin


def names() -> list[str]:
    """Every kind's name, in a stable order (registered at run time last)."""
    return sorted(_declared()) + [k for k in _added if k not in _declared()]


def kind(name: str) -> ChannelKind | None:
    """The kind called `name`, loaded on first use; None if no such kind is registered."""
    if name in _added:
        return _added[name]
    if name not in _declared():
        return None
    return _loaded(name)


def by_section_key(key: str) -> ChannelKind | None:
    """The kind whose TOML section is `key`, or None. Loads only the kind it finds."""
    for name in names():
        found = kind(name)
        if found is not None and found.section_key == key:
            return found
    return None


def approver_fields() -> dict[str, ChannelKind]:
    """The approver keys the kinds define (`slack_user_id` -> the slack kind)."""
    out: dict[str, ChannelKind] = {}
    for name in names():
        found = kind(name)
        if found is not None and found.approver_field:
            out[found.approver_field] = found
    return out


def register(plugin: ChannelKind) -> None:
    """Add a kind at run time (it wins over an entry point of the same name)."""
    _added[plugin.kind] = plugin


def unregister(name: str) -> None:
    _added.pop(name, None)


@contextmanager
def registered(plugin: ChannelKind) -> Iterator[ChannelKind]:
    """`register` for the span of a `with` block (a test's channel)."""
    register(plugin)
    try:
        yield plugin
    finally:
        unregister(plugin.kind)
