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


def prepare(settings: Settings, config: Config) -> None:
    """Before a role starts: each configured kind makes what it needs (`ChannelPlugin.prepare`)."""
    for found in configured(config):
        found.prepare(settings, config)
