"""One error shape for every failure: `{"error": code, "detail": text}` with a 4xx status.

Broker errors map to statuses here, so route modules just raise them. The catch-all handler
answers without the exception's text, so secrets or internals never leak into a response.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker.domain.errors import BrokerError, Conflict
from broker.facade import UNAVAILABLE
from channels.errors import broker_error_status

log = logging.getLogger("approval_broker.api")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    410: "gone",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "too_many_requests",
}


class ApiError(Exception):
    """An error the API answers with as is: status, code, detail and optional extra fields."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers
        self.extra = extra


def error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail, **extra}, status, headers=headers)


def unauthorized(detail: str = "a valid bearer token is required") -> ApiError:
    return ApiError(401, "unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})


def _validation_detail(exc: RequestValidationError) -> str:
    """`body.outcome: Input should be ...; ...` without echoing the input (it may hold secrets)."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


def api_error_response(exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.code, exc.detail, exc.headers, **exc.extra)


def broker_error_response(exc: BrokerError) -> JSONResponse:
    """The answer to a broker error: its status, and for a 409 the request as recorded."""
    status = broker_error_status(exc)
    if isinstance(exc, Conflict):
        request = exc.request.public() if hasattr(exc.request, "public") else exc.request
        return error_response(409, exc.code, exc.detail, request=request)
    return error_response(status, exc.code, exc.detail)


def redis_error_response(exc: Exception) -> JSONResponse:
    log.error("Redis error: %s: %s", type(exc).__name__, exc)
    return error_response(503, "unavailable", "the broker's Redis is not reachable; try again")


def known_error_response(exc: Exception) -> JSONResponse | None:
    """The answer to an error a route may raise on purpose (None: not one of those).

    For callers outside the router (api.fastpaths), which the handlers below don't reach.
    """
    if isinstance(exc, ApiError):
        return api_error_response(exc)
    if isinstance(exc, BrokerError):
        return broker_error_response(exc)
    if isinstance(exc, UNAVAILABLE):
        return redis_error_response(exc)
    return None


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return api_error_response(exc)


async def _broker_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BrokerError)
    return broker_error_response(exc)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(422, "invalid", _validation_detail(exc))


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = getattr(exc, "code", None) or _STATUS_CODES.get(exc.status_code, "error")
    detail = exc.detail if isinstance(exc.detail, str) else code
    return error_response(exc.status_code, code, detail, dict(exc.headers or {}) or None)


async def _unicode_error(_: Request, exc: Exception) -> JSONResponse:
    return error_response(422, "invalid", "text must be valid Unicode (no lone surrogates)")


async def _redis_error(_: Request, exc: Exception) -> JSONResponse:
    return redis_error_response(exc)


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled %s in the API", type(exc).__name__, exc_info=exc)
    return error_response(500, "internal", "internal error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(BrokerError, _broker_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(UnicodeError, _unicode_error)
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _redis_error)
    app.add_exception_handler(Exception, _internal_error)
