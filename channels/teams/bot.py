"""The Microsoft 365 Agents SDK's pieces of the Teams bot: its JWT validator checks the Bot
Framework token, its FastAPI `CloudAdapter` turns the request into a turn, and its
`AgentApplication` routes `adaptiveCard/action` invokes (`Action.Execute`) to
`channels/teams/actions.py`, whose answer becomes the invoke response's card.

Imported by `channels/teams/routes.py` on the first activity only: the SDK takes seconds to import, which
an API without `[teams]` never pays. Without `[teams] app_id` the SDK runs in its anonymous
mode (no token needed inbound, none sent outbound), which the config allows only with
`allow_anonymous = true`: a local emulator or tests.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from jwt import PyJWTError
from microsoft_agents.activity import AdaptiveCardInvokeResponse
from microsoft_agents.authentication.msal import MsalConnectionManager
from microsoft_agents.hosting.core import (
    AgentApplication,
    AgentAuthConfiguration,
    ClaimsIdentity,
    MemoryStorage,
    OutboundHostValidator,
    TurnContext,
    TurnState,
)
from microsoft_agents.hosting.core.authorization.jwt import JwtTokenValidator
from microsoft_agents.hosting.fastapi import CloudAdapter
from starlette.concurrency import run_in_threadpool

from broker.facade import UNAVAILABLE
from channels.errors import Refused
from channels.inbound import InboundHost
from channels.teams import adaptive_cards as cards
from channels.teams.actions import Click, handle_click
from channels.teams.activities import check_activity, check_token
from channels.teams.config import TeamsConfig

log = logging.getLogger("approval_broker.api")

CARD = "application/vnd.microsoft.card.adaptive"
MESSAGE = "application/vnd.microsoft.activity.message"
VERB = re.compile("^(" + "|".join(cards.VERBS) + ")$")


def auth_configuration(teams: TeamsConfig) -> AgentAuthConfiguration:
    """The SDK's settings for the bot's app registration (anonymous without an app_id)."""
    return AgentAuthConfiguration(
        client_id=teams.app_id,
        tenant_id=teams.tenant_id,
        client_secret=teams.app_password,
        anonymous_allowed=teams.anonymous,
    )


def host_validator(teams: TeamsConfig) -> OutboundHostValidator:
    """Which service URLs an activity may name: with an app id, Microsoft's Teams and Bot
    Connector hosts and those of the configured channels (an activity naming another is
    refused, 401); in anonymous mode (a local emulator on loopback) the SDK's default, off."""
    if teams.anonymous:
        return OutboundHostValidator(enabled=False)
    hosts = sorted({urlsplit(c.service_url).hostname or "" for c in teams.channels.values()})
    return OutboundHostValidator(hosts=[h for h in hosts if h], enabled=True)


class TeamsBot:
    """The SDK's pieces for one app: the adapter, the application and its card handler."""

    def __init__(self, host: InboundHost, teams: TeamsConfig) -> None:
        self.host = host
        self.teams = teams
        self.auth = auth_configuration(teams)
        connections = MsalConnectionManager(
            connections_configurations={"SERVICE_CONNECTION": self.auth}
        )
        self.adapter = CloudAdapter(
            connection_manager=connections, host_validator=host_validator(teams)
        )
        self.adapter.on_turn_error = self.on_turn_error
        self.app: AgentApplication[TurnState] = AgentApplication[TurnState](
            storage=MemoryStorage(), connection_manager=connections, start_typing_timer=False
        )
        self.app.adaptive_card.action_execute(VERB)(self.on_action)

    async def on_turn_error(self, context: TurnContext, error: Exception) -> None:
        """Logged, never posted into the chat (the SDK's default would show the error there)."""
        log.error("Teams turn failed: %s", type(error).__name__, exc_info=error)

    async def on_action(
        self, context: TurnContext, _state: TurnState, data: object
    ) -> AdaptiveCardInvokeResponse:
        """An `Action.Execute` click: decided in a thread, answered with the card."""
        activity = context.activity
        value = activity.value if isinstance(activity.value, dict) else {}
        verb = str((value.get("action") or {}).get("verb") or "")
        sender = activity.from_property
        conversation = activity.conversation
        tenant = conversation.tenant_id if conversation else None
        if not tenant and isinstance(activity.channel_data, dict):
            tenant = (activity.channel_data.get("tenant") or {}).get("id")
        click = Click(
            verb=verb,
            data=data if isinstance(data, dict) else {},
            user_aad_id=sender.aad_object_id if sender else None,
            conversation_id=conversation.id if conversation else "",
            tenant_id=tenant,
            activity_id=activity.id,
        )
        try:
            answer = await run_in_threadpool(handle_click, self.host, self.teams, click)
        except UNAVAILABLE as exc:
            log.error("Redis error on a Teams click: %s", type(exc).__name__)
            text = "The broker can't record clicks right now; please try again."
            return AdaptiveCardInvokeResponse(status_code=HTTPStatus.OK, type=MESSAGE, value=text)
        if answer.card is None:
            return AdaptiveCardInvokeResponse(
                status_code=HTTPStatus.OK, type=MESSAGE, value=answer.text
            )
        return AdaptiveCardInvokeResponse(status_code=HTTPStatus.OK, type=CARD, value=answer.card)

    async def authenticate(self, header: str | None) -> ClaimsIdentity:
        """The Bot Framework token checked by the SDK's validator (signature against the Bot
        Framework's keys, audience = our app id, issuer, expiry); 401 otherwise."""
        validator = JwtTokenValidator(self.auth)
        if not header:
            if self.auth.ANONYMOUS_ALLOWED:
                return validator.get_anonymous_claims()
            raise Refused(401, "unauthorized", "a Bot Framework token is required")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Refused(401, "unauthorized", "the Authorization header is not 'Bearer TOKEN'")
        check_token(token, self.teams.app_id)  # its shape, before the SDK reads it
        try:
            return await validator.validate_token(token)
        except (PyJWTError, ValueError) as exc:
            log.warning("Teams token refused: %s", type(exc).__name__)
            raise Refused(401, "unauthorized", "the Bot Framework token is not valid") from None

    @staticmethod
    def check_activity(body: bytes) -> dict[str, Any]:
        """The activity, or 400: what the adapter would otherwise fail on with a 5xx."""
        return check_activity(body)
