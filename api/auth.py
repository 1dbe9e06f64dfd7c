"""Bearer-token authentication and role checks as FastAPI dependencies.

Tokens are looked up by sha256 in constant time (broker.domain.principals); the admin token has every role.
The dependencies are `async def` though they never await: FastAPI runs a sync dependency in
its thread pool, one hop per dependency per request, for a check that takes microseconds.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError, unauthorized
from api.state import State
from broker.domain.principals import REQUESTER, Principal, authenticate

bearer = HTTPBearer(
    auto_error=False,
    description="An approver's token (config stores its sha256) or APPROVAL_BROKER_ADMIN_TOKEN.",
)


async def current_principal(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    state: State,
) -> Principal:
    """The caller, or 401 with `WWW-Authenticate: Bearer`."""
    if credentials is None:
        raise unauthorized()
    principal = authenticate(state.config, credentials.credentials, state.settings.admin_token)
    if principal is None:
        raise unauthorized("the bearer token is not valid")
    return principal


Caller = Annotated[Principal, Depends(current_principal)]


async def requester(principal: Caller) -> Principal:
    """A caller with the `requester` role: may create requests and start runs."""
    if not principal.has_role(REQUESTER):
        raise ApiError(403, "forbidden", f"{principal.name!r} does not have the 'requester' role")
    return principal


Requester = Annotated[Principal, Depends(requester)]
