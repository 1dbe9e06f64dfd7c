"""How a channel's inbound route refuses a call: an HTTP status, an error code and a detail.

A Starlette `HTTPException` with the project's error `code`: the API answers it in its one
error shape (`{"error": code, "detail": text}`, api/errors.py), so a channel never builds an
answer for a refusal itself and never imports the API.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException

from broker.domain.errors import BrokerError, Conflict, Forbidden, InvalidInput, NotFound

# Broker error codes that mean "the body names something that does not exist": 422, not 404.
_UNPROCESSABLE_NOT_FOUND = {"unknown_agent"}
# Broker error codes of input that clashes with what exists (a rule kept already): 409.
_CONFLICTING_INPUT = {"rule_exists"}


class Refused(HTTPException):
    """`status` `code`: `detail` (headers go out with the answer, e.g. WWW-Authenticate)."""

    def __init__(
        self, status: int, code: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status, detail, headers)
        self.code = code


def not_configured(what: str) -> Refused:
    return Refused(404, "not_configured", f"{what} is not configured")


def broker_error_status(exc: BrokerError) -> int:
    """The HTTP status a broker error stands for."""
    if isinstance(exc, NotFound):
        return 422 if exc.code in _UNPROCESSABLE_NOT_FOUND else 404
    if isinstance(exc, Conflict):
        return 409
    if isinstance(exc, Forbidden):
        return 403
    if isinstance(exc, InvalidInput):
        return 409 if exc.code in _CONFLICTING_INPUT else 422
    return 400
