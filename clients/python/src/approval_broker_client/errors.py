"""Errors of the broker, and the HTTP API's error answers read back as them.

404 -> `NotFound`, 409 -> `Conflict` (carrying the request as it stands), 403 -> `Forbidden`,
422 -> `InvalidInput` (or `NotFound` where the broker raised one), 401 -> `Unauthorized`; any
other status is a `RemoteError` with it. The API's `error` code is kept as the error's `code`.
The broker itself raises these same classes (`broker.domain.errors` re-exports them), so code written
against the in-fleet client handles a remote one's errors alike.
"""

from __future__ import annotations

from typing import Any

import httpx

from approval_broker_client.models import Request

_NOT_FOUND_422 = frozenset({"unknown_agent"})
"""422 codes the broker raises as `NotFound` (the body names something that doesn't exist)."""


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


class RemoteError(BrokerError):
    """An error answer with no broker error class of its own (401, 413, 429, 5xx...)."""

    code = "remote"

    def __init__(self, detail: str, *, status: int, code: str | None = None) -> None:
        super().__init__(detail, code=code)
        self.status = status


class Unauthorized(RemoteError):
    code = "unauthorized"


def error_for(response: httpx.Response) -> BrokerError:
    """The broker error an error answer stands for (the API's `{"error", "detail"}` body)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    status = response.status_code
    code = str(body.get("error") or f"http_{status}")
    detail = str(body.get("detail") or response.reason_phrase or code)
    if status == 404:
        return NotFound(detail, code=code)
    if status == 409:
        raw = body.get("request")
        request = Request.model_validate(raw) if isinstance(raw, dict) else None
        return Conflict(detail, request=request, code=code)
    if status == 403:
        return Forbidden(detail, code=code)
    if status == 401:
        return Unauthorized(detail, status=status, code=code)
    if status == 422:
        if code in _NOT_FOUND_422:
            return NotFound(detail, code=code)
        return InvalidInput(detail, code=code)
    return RemoteError(detail, status=status, code=code)
