"""Errors the broker raises; each carries a stable code that the API and CLI show as is.

The classes an app also sees are defined once, in the client package, so an error a remote
client raises is the same class the in-fleet `broker.facade.Broker` raises.
"""

from __future__ import annotations

from approval_broker_client.errors import (
    BrokerError,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
)


class ConfigError(BrokerError):
    """A config file or environment that the broker refuses to start with."""

    code = "config"


__all__ = ["BrokerError", "ConfigError", "Conflict", "Forbidden", "InvalidInput", "NotFound"]
