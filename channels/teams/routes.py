"""Microsoft Teams activities (`POST /v1/teams/messages`): the route.

The bot itself (the Microsoft 365 Agents SDK's token check, adapter and application) is
`channels/teams/bot.py`, imported on the first activity; clicks are decided in
`channels/teams/actions.py` through the one decision service and answered with the card refreshed
to the outcome (the `Action.Execute` invoke response); updating the card for everyone else is
the notifier's job (it sees the event). Errors of our own (no or a bad token, a body that is
no activity) answer 4xx with `{"error", "detail"}`; nothing a Teams client sends makes a 500.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from approval_broker_client.models import ErrorBody
from fastapi import APIRouter, Request, Response

from channels.errors import Refused
from channels.inbound import Host, InboundHost
from channels.teams.config import teams_section

if TYPE_CHECKING:
    from channels.teams.bot import TeamsBot

router = APIRouter(prefix="/v1/teams", tags=["teams"])


def bot_of(request: Request, host: InboundHost) -> TeamsBot:
    """The app's Teams bot, built on first use (404 when Teams is not configured)."""
    teams = teams_section(host.config)
    if teams is None:
        raise Refused(404, "not_configured", "Microsoft Teams is not configured")
    bot: TeamsBot | None = getattr(request.app.state, "teams_bot", None)
    if bot is None:
        from channels.teams.bot import TeamsBot  # the SDK, imported only where Teams is used

        bot = request.app.state.teams_bot = TeamsBot(host, teams)
    return bot


@router.post(
    "/messages",
    response_model=None,
    responses={
        200: {"description": "an invoke answered (Action.Execute: the refreshed card)"},
        202: {"description": "an activity accepted"},
        400: {"model": ErrorBody},
        401: {"model": ErrorBody, "description": "no or a bad Bot Framework token"},
    },
)
async def teams_messages(request: Request, host: Host) -> Response:
    """Activities from the Bot Connector: card clicks (`adaptiveCard/action`) decide."""
    bot = bot_of(request, host)
    identity = await bot.authenticate(request.headers.get("authorization"))
    bot.check_activity(await request.body())
    request.state.claims_identity = identity  # where the SDK's adapter reads the caller
    response = await bot.adapter.process(request, bot.app)
    return response if response is not None else Response(status_code=202)
