"""Channels: how requests reach people and systems, and how their replies come back.

One folder per kind (`channels/<kind>/`: its config section, its sender, its rendering, its
inbound routes, its templates), each a plugin (`channels.plugin.ChannelPlugin`) registered by
an `approval_broker.channels` entry point in pyproject.toml and loaded by name, lazily
(`plugin`). The modules here are what several kinds share; a kind never imports another, and
nothing outside this package imports a kind's folder.
"""

from __future__ import annotations

from typing import cast

from broker.domain import channel_kinds
from broker.domain.config import Config
from broker.domain.errors import ConfigError
from broker.domain.settings import Settings
from channels.plugin import ChannelPlugin


def plugin(kind: str) -> ChannelPlugin:
    """The plugin of channel kind `kind` (KeyError if none is registered)."""
    found = channel_kinds.kind(kind)
    if found is None:
        raise KeyError(kind)
    return cast(ChannelPlugin, found)


def plugins() -> list[ChannelPlugin]:
    """Every registered kind's plugin (each loaded: light, by contract)."""
    return [plugin(name) for name in channel_kinds.names()]


def configured(config: Config) -> list[ChannelPlugin]:
    """The kinds the config uses (a section of theirs, or always on: the inbox)."""
    return [p for p in plugins() if p.always_on or config.section(p.kind) is not None]


def missing_extra(config: Config) -> str | None:
    """Why a configured kind can't run here: its extra is not installed (one line naming the
    file and the extra), or None. `config check`, `up`, the API and the notifier all ask."""
    for found in configured(config):
        module = found.missing_dependency()
        if module is not None:
            extra = found.extra or found.kind
            return (
                f"{config.source}: [{found.section_key or found.kind}] is configured but the"
                f" {found.title} extra is not installed (no module {module}):"
                f" uv add 'approval-broker[{extra}]'"
            )
    return None


def check_installed(config: Config) -> None:
    """ConfigError when a configured kind's extra is missing (`missing_extra`)."""
    problem = missing_extra(config)
    if problem is not None:
        raise ConfigError(problem)


def prepare(settings: Settings, config: Config) -> None:
    """Before a role starts: every configured kind is installed (its extra), then each makes
    what it needs (`ChannelPlugin.prepare`)."""
    check_installed(config)
    for found in configured(config):
        found.prepare(settings, config)
