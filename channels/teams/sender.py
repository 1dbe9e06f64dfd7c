"""Microsoft Teams: one Adaptive Card per request and channel, posted into the configured
conversation and updated in place as the request moves.

Calls go through the Microsoft 365 Agents SDK's `ConnectorClient` (the Bot Connector REST API:
`POST /v3/conversations/{id}/activities`, `PUT .../activities/{activityId}`), with a token the
SDK's `MsalAuth` gets for the bot's app registration (none in the anonymous mode of a local
emulator). The SDK is asyncio; a delivery runs in the notifier's own threads, so each call runs
on a short-lived event loop of its own there (`asyncio.run`), never on anyone else's loop.

The posted card is remembered in Redis (conversation, activity id) the way Slack's messages
are (`broker.deliveries`), posting is claimed first so two notifiers never both post,
and a redelivered event updates the card. The Connector API has no look-up of an earlier post
by its content, so a post whose answer was lost (a timeout after sending, a 5xx) is posted
again on the next try: a duplicate card is possible then, and logged.

A 429 (or a 503 with Retry-After) pauses the whole channel for its Retry-After (capped, with
jitter); 5xx and connection errors are retried with the notifier's back-off; other 4xx give up
(dead letter). `update_teams_copy` edits one posted card on its own: the card sync of every
channel's copies calls it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from microsoft_agents.activity import Activity, ActivityTypes, Attachment
from microsoft_agents.authentication.msal import MsalAuth
from microsoft_agents.hosting.core import AgentAuthConfiguration
from microsoft_agents.hosting.core.connector.client import ConnectorClient

from broker.domain.config import Config
from broker.domain.models import Request
from broker.facade import Broker, DeliveryState, PostState
from channels.cards.sender import CardSender
from channels.retry import (
    Defer,
    GiveUp,
    Retry,
    RetryPolicy,
    cap_retry_after,
    parse_retry_after,
    pause_delay,
)
from channels.teams import adaptive_cards as teams_cards
from channels.teams.config import TeamsChannelConfig, TeamsConfig

log = logging.getLogger("notifiers")

BOT_FRAMEWORK = "https://api.botframework.com"
BOT_FRAMEWORK_SCOPE = f"{BOT_FRAMEWORK}/.default"
CARD = "application/vnd.microsoft.card.adaptive"
T = TypeVar("T")


class Throttled(Retry):
    """Teams asked the whole bot to slow down (429, or 503 with Retry-After)."""


class TeamsTokens:
    """Bot Connector tokens for the bot's app registration (MSAL caches and renews them);
    the empty token in anonymous mode, where the SDK sends no Authorization header."""

    def __init__(self, teams: TeamsConfig) -> None:
        self.auth: MsalAuth | None = None
        if not teams.anonymous:
            self.auth = MsalAuth(
                AgentAuthConfiguration(
                    client_id=teams.app_id,
                    tenant_id=teams.tenant_id,
                    client_secret=teams.app_password,
                )
            )

    async def token(self) -> str:
        if self.auth is None:
            return ""
        return await self.auth.get_access_token(BOT_FRAMEWORK, [BOT_FRAMEWORK_SCOPE])


def card_activity(request: Request, config: Config, channel: str, tenant: str | None) -> Activity:
    """The message activity carrying `request`'s card as shown in `channel`."""
    card = teams_cards.render(request, config, channel)
    activity = Activity(
        type=ActivityTypes.message,
        text=teams_cards.summary(request),
        text_format="plain",
        attachments=[Attachment(content_type=CARD, content=card)],
    )
    if tenant:
        activity.channel_data = {"tenant": {"id": tenant}}
    return activity


@dataclass(frozen=True)
class TeamsCopy:
    """One posted card: where it is (the channel's conversation reference) and its id."""

    channel: str  # teams:NAME
    target: TeamsChannelConfig
    activity_id: str


class TeamsCalls:
    """The Connector calls of one Teams bot, each sorted into done / Retry / GiveUp."""

    def __init__(self, teams: TeamsConfig, timeout_s: float) -> None:
        self.teams = teams
        self.tokens = TeamsTokens(teams)
        self.timeout_s = timeout_s

    def post(self, target: TeamsChannelConfig, activity: Activity) -> str:
        """Post `activity` into the conversation; the new activity's id."""

        async def call(client: ConnectorClient) -> str:
            response = await client.conversations.send_to_conversation(
                target.conversation_id, activity
            )
            if not response.id:
                raise GiveUp("the Connector answered without an activity id")
            return str(response.id)

        return self._run(target, call)

    def update(self, target: TeamsChannelConfig, activity_id: str, activity: Activity) -> None:
        async def call(client: ConnectorClient) -> None:
            activity.id = activity_id
            await client.conversations.update_activity(
                target.conversation_id, activity_id, activity
            )

        self._run(target, call)

    def _run(
        self, target: TeamsChannelConfig, call: Callable[[ConnectorClient], Awaitable[T]]
    ) -> T:
        return asyncio.run(self._with_client(target, call))

    async def _with_client(
        self, target: TeamsChannelConfig, call: Callable[[ConnectorClient], Awaitable[T]]
    ) -> T:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            token = await asyncio.wait_for(self.tokens.token(), self.timeout_s)
        except TimeoutError:
            raise Retry("no token from Entra ID in time") from None
        except Exception as exc:  # MSAL's own errors: a refused secret, Entra ID unreachable
            # retried like any failure: an outage passes, a wrong secret ends in a dead letter
            raise Retry(f"no token for the bot's app registration: {type(exc).__name__}") from None
        base = target.service_url if target.service_url.endswith("/") else target.service_url + "/"
        session = aiohttp.ClientSession(base_url=base, timeout=timeout)
        client = ConnectorClient(base, token, session=session)
        try:
            return await call(client)
        except aiohttp.ClientResponseError as exc:
            raise classify(exc) from None
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise Retry("no answer from the Teams Connector in time", unclear=True) from None
        except aiohttp.ClientConnectionError as exc:
            raise Retry(f"Teams Connector unreachable: {type(exc).__name__}") from None
        finally:
            await client.close()


def classify(exc: aiohttp.ClientResponseError) -> Retry | GiveUp:
    """A Connector error answer as the notifier's retry decision."""
    headers: Mapping[str, str] = exc.headers or {}
    retry_after = parse_retry_after(headers.get("Retry-After"))
    if exc.status == 429 or (exc.status == 503 and retry_after is not None):
        wait = cap_retry_after(retry_after if retry_after is not None else 1.0)
        return Throttled(f"Teams answered {exc.status}", retry_after=wait)
    if exc.status >= 500:
        return Retry(f"Teams answered {exc.status}", unclear=True)
    return GiveUp(f"Teams refused the call: HTTP {exc.status}")


def update_teams_copy(calls: TeamsCalls, config: Config, copy: TeamsCopy, request: Request) -> str:
    """Edit one posted card so it shows `request` as it stands now (its outcome, a vote, an
    escalation). Raises Retry or GiveUp like a delivery, for the caller to retry."""
    activity = card_activity(request, config, copy.channel, copy.target.tenant_id)
    calls.update(copy.target, copy.activity_id, activity)
    return f"updated {copy.activity_id}"


class TeamsSender(CardSender):
    """`teams:NAME`: a card per request in the conversation `[teams.channels.NAME]` names,
    posted once and kept in sync like every chat card (`channels.cards.sender`)."""

    kind = "teams"

    def __init__(
        self,
        name: str,
        target: TeamsChannelConfig,
        *,
        calls: TeamsCalls,
        broker: Broker,
        config: Config,
        state: DeliveryState,
        consumer: str,
        policy: RetryPolicy,
        concurrency: int,
        claim_stale_s: float,
    ) -> None:
        super().__init__(
            name,
            broker=broker,
            config=config,
            state=state,
            consumer=consumer,
            policy=policy,
            concurrency=concurrency,
            claim_stale_s=claim_stale_s,
        )
        self.target = target
        self.calls = calls

    def post(self, request: Request) -> PostState:
        activity = card_activity(request, self.config, self.name, self.target.tenant_id)
        activity_id = self._call(lambda: self.calls.post(self.target, activity))
        return PostState(self.target.conversation_id, activity_id)

    def update_copy(self, copy: PostState, request: Request, what: str) -> str:
        """Bring a posted card up to date (`channels.copies.CopyUpdater`): the router hands a
        Teams channel every later event of a request it posted, whatever queue it is in now."""
        card = TeamsCopy(self.name, self.target, str(copy.ts))
        note = self._call(lambda: update_teams_copy(self.calls, self.config, card, request))
        return f"{what}: {note}"

    def _call(self, call: Callable[[], T]) -> T:
        """One Connector call, after any pause the far end asked for; a 429 pauses the channel."""
        wait = self.not_before - time.monotonic()
        if wait > 0:
            raise Defer("Teams asked us to slow down", delay=pause_delay(wait))
        try:
            return call()
        except Throttled as exc:
            pause = exc.retry_after or 1.0
            self.not_before = max(self.not_before, time.monotonic() + pause)
            raise Retry(str(exc), retry_after=pause_delay(pause)) from None
