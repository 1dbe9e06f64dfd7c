"""Approval receipts over HTTP: the public keys, and spending a receipt where the tool runs.

`GET /.well-known/jwks.json` (no token) serves the keys receipts are checked with, so an app
can verify one with any JOSE library. `POST /v1/requests/{id}/receipt/spend` is how an agent
outside the fleet (`BrokerApprovals`) uses its receipt just before it runs the approved tool:
the broker checks it as the fleet worker does (`broker.receipts.checks`) and spends its jti once.
This module only parses and answers; the checks are the broker's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from api.auth import Caller
from api.errors import ApiError
from api.requests import RequestId, visible_request
from api.schemas import ERRORS, ErrorBody
from api.state import State
from broker.domain.errors import Forbidden
from broker.domain.principals import EVERY_ROLE
from broker.domain.receipts import ReceiptRefused
from broker.receipts.checks import ReceiptChecks

router = APIRouter(tags=["receipts"])


class SpendBody(BaseModel):
    """The call about to run: its tool and the args it will run with."""

    model_config = ConfigDict(extra="forbid")

    tool_name: str = Field(min_length=1, max_length=200)
    args: dict[str, JsonValue] = Field(default_factory=dict)


class Spent(BaseModel):
    request_id: str
    jti: str
    spent: bool = True


def _receipts_off() -> ApiError:
    return ApiError(404, "receipts_off", "this broker signs no receipts ([receipts] has no key)")


@router.get(
    "/.well-known/jwks.json",
    response_model=None,
    responses={200: {"description": "a JWK Set (RFC 7517)"}, 404: {"model": ErrorBody}},
)
def jwks(state: State) -> JSONResponse:
    """The public keys approval receipts are signed with (current and rotated-out ones)."""
    receipts = state.broker.receipts
    if receipts is None:
        raise _receipts_off()
    return JSONResponse(receipts.keys.jwks(), headers={"Cache-Control": "public, max-age=300"})


@router.post(
    "/v1/requests/{request_id}/receipt/spend",
    response_model=None,
    responses={
        200: {"model": Spent, "description": "the receipt holds and is now spent: run the tool"},
        409: {"model": ErrorBody, "description": "refused (`reason`): do not run the tool"},
        **ERRORS,
    },
)
def spend(request_id: RequestId, body: SpendBody, principal: Caller, state: State) -> JSONResponse:
    """Check the request's receipt for running `tool_name` with `args` now, and spend it.

    Only the request's creator (the agent that asked) or the admin may: anyone else spending
    it would keep the agent's tool from running."""
    checks = ReceiptChecks(state.broker)
    if checks.receipts is None:
        raise _receipts_off()
    request = visible_request(state, principal, request_id)
    if EVERY_ROLE not in principal.roles and request.created_by != principal.name:
        raise Forbidden(
            f"{principal.name!r} may not spend the receipt of request {request.id}: only the"
            " one who asked for it (the agent about to run the tool) may"
        )
    try:
        claims: dict[str, Any] | None = checks.spend(
            request, tool_name=body.tool_name, args=dict(body.args)
        )
    except ReceiptRefused as exc:
        raise ApiError(
            409, "receipt_refused", f"{exc.reason}: {exc.detail}", reason=exc.reason
        ) from None
    jti = str((claims or {}).get("jti", ""))
    return JSONResponse(Spent(request_id=request.id, jti=jti).model_dump())
