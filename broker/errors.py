"""Errors the broker raises; each carries a stable code that the API and CLI show as is."""

from __future__ import annotations

from typing import Any


class BrokerError(Exception):
    """Base class: `code` is a short machine-readable name, the message is for people."""

    code = "broker_error"

    def __init__(self, detail: str, *, code: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code


class NotFound(BrokerError):
    code = "not_found"


class InvalidInput(BrokerError):
    """The caller asked for something that can never succeed as given (HTTP 422)."""

    code = "invalid"


class Conflict(BrokerError):
    """The request was already decided or timed out; `request` is its state as it stands."""

    code = "conflict"

    def __init__(self, detail: str, *, request: Any, code: str | None = None) -> None:
        super().__init__(detail, code=code)
        self.request = request


class Forbidden(BrokerError):
    code = "forbidden"


class ConfigError(BrokerError):
    """A config file or environment that the broker refuses to start with."""

    code = "config"
