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
from broker.domain.config import Config
from broker.domain.errors import Forbidden
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


class NotAnApprover(Forbidden):
    """A chat account the config names as no approver's. Its text names only the account the
    clicker sent (`api.refusals` shows it as is), never a request, queue or channel."""


def approver_by_slack_user(config: Config, user_id: str) -> Principal:
    """The approver whose `slack_user_id` this is.

    Anyone else in the channel (a guest, a Slack Connect member) is refused: a Slack account
    is only an approver once the config names it.
    """
    for name, approver in config.approvers.items():
        if approver.slack_user_id and approver.slack_user_id == user_id:
            return Principal(name, frozenset(approver.roles))
    raise NotAnApprover(f"Slack user {user_id} is not an approver here (no slack_user_id matches)")


def approver_by_teams_user(config: Config, aad_object_id: str | None) -> Principal:
    """The approver whose `teams_user_id` (an Entra ID object id) this is; anyone else in the
    team or chat (a guest, another tenant's user) is refused. Ids are compared without case,
    as GUIDs are."""
    wanted = (aad_object_id or "").strip().casefold()
    for name, approver in config.approvers.items():
        if wanted and approver.teams_user_id and approver.teams_user_id.casefold() == wanted:
            return Principal(name, frozenset(approver.roles))
    raise NotAnApprover(
        "You are not an approver here: no approver's teams_user_id is your Entra ID object id"
        f" ({aad_object_id or 'none sent'})"
    )


def approver_by_chat_user(config: Config, platform: str, user_id: str) -> Principal:
    """The approver whose `telegram_user_id` / `discord_user_id` (as `platform` says) this is.

    As with Slack, anyone else in the chat is refused: an account is an approver only once the
    config names it, and then it is that approver on every channel (`broker.domain.persons`).
    """
    for name, approver in config.approvers.items():
        known = approver.telegram_user_id if platform == "telegram" else approver.discord_user_id
        if known is not None and str(known) == user_id:
            return Principal(name, frozenset(approver.roles))
    raise NotAnApprover(
        f"{platform.capitalize()} user {user_id} is not an approver here"
        f" (no {platform}_user_id matches)"
    )
