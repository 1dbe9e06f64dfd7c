"""Slack: one Block Kit message per request and channel, updated in place as the request moves.

The posted message is remembered in Redis as (channel, ts) before anything else happens, so a
redelivered event updates it rather than posting a second one. Posting is claimed first, so two
notifiers handling two events of one request at once never both post.

chat.postMessage is never re-sent blindly. slack_sdk's own retry handlers are off (they would
re-send after a 5xx or a reset, when Slack may already have posted). A failure that leaves it
unclear whether Slack posted (a timeout or reset after the request went out, a 5xx) keeps the
claim, and the next attempt first looks the message up by its metadata (conversations.history,
which needs the `channels:history` / `groups:history` scopes); so does a notifier taking over a
claim whose owner died mid-post. Only if it is not there is it posted again. The look-up waits
out the call timeout first, so a post Slack was still finishing is seen. Without the scopes the
look-up is refused and the message is posted again: a duplicate is then possible, and logged.

A 429 pauses the whole channel for its Retry-After (capped, with jitter); 5xx and connection
errors are retried with the notifier's back-off.
"""

from __future__ import annotations

import http.client
import logging
import secrets
import time
import urllib.error
from collections.abc import Callable
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web import SlackResponse

from broker.domain.config import Config
from broker.domain.models import Request
from broker.facade import Broker, DeliveryState, PostState
from channels.retry import (
    Defer,
    GiveUp,
    Retry,
    RetryPolicy,
    cap_retry_after,
    parse_retry_after,
    pause_delay,
)
from channels.sender import Delivery, Sender
from channels.slack import action_ids as slack_ids
from channels.slack.blocks import channel_serves, fingerprint, render
from channels.slack.config import SlackConfig

log = logging.getLogger("notifiers")

TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
# errors after which Slack says some of the operation may have happened
UNCLEAR_ERRORS = frozenset({"internal_error", "fatal_error", "service_unavailable"})
LOOKUP_PAGES = 5  # of 200 messages: how far back an earlier post is looked for
LOOKUP_MARGIN_S = 120.0  # clocks of our hosts and Slack's may differ


def slack_client(config: SlackConfig, timeout_s: float) -> WebClient:
    """A client that never retries on its own: a re-sent postMessage could post twice."""
    return WebClient(
        token=config.bot_token,
        base_url=config.api_base_url,
        timeout=int(max(1, timeout_s)),
        retry_handlers=[],
    )


class SlackSender(Sender):
    kind = "slack"

    def __init__(
        self,
        name: str,
        slack_channel: str,
        *,
        client: WebClient,
        broker: Broker,
        config: Config,
        state: DeliveryState,
        consumer: str,
        policy: RetryPolicy,
        concurrency: int,
        claim_stale_s: float,
        timeout_s: float = 15.0,
    ) -> None:
        super().__init__(name, policy=policy, concurrency=concurrency)
        self.slack_channel = slack_channel
        self.client = client
        self.broker = broker
        self.config = config
        self.state = state
        self.consumer = consumer
        self.claim_stale_s = claim_stale_s
        self.timeout_s = timeout_s

    def deliver(self, delivery: Delivery) -> str | None:
        event = delivery.event
        request = self.broker.get_request(event.request_id)
        found = self.state.post_state(request.id, self.name)
        if found.posted:
            return self._update(found, request, event.type)
        if event.moved_away or not channel_serves(self.config, self.name, event.queue):
            return None  # never posted here, and not this channel's queue: nothing to update
        claimant = delivery.memo("claimant", lambda: f"{self.consumer}:{secrets.token_hex(4)}")
        claimed, found = self.state.claim_post(request.id, self.name, claimant, self.claim_stale_s)
        if not claimed:
            if found.posted:
                return self._update(found, request, event.type)
            raise Defer("another notifier is posting this message", delay=0.5)
        if found.claimed_at is not None:  # an earlier attempt may have posted it
            earlier = self._find_posted(request, since=found.claimed_at)
            if earlier is not None:
                return self._posted(earlier, request, event.type, "found the earlier post")
        text, blocks = render(request, self.config, self.name)
        try:
            response = self._call(
                self.client.chat_postMessage,
                channel=self.slack_channel,
                text=text,
                blocks=blocks,
                metadata={
                    "event_type": slack_ids.MESSAGE_EVENT_TYPE,
                    "event_payload": {"request_id": request.id, "queue": request.queue},
                },
            )
        except Retry as exc:
            if not exc.unclear:
                self.state.release_claim(request.id, self.name, claimant)
                raise
            # keep the claim; look before posting again, once Slack has surely finished
            raise Retry(
                f"{exc} (it may have been posted: looking before posting again)",
                retry_after=max(exc.retry_after or 0.0, self.timeout_s),
                unclear=True,
            ) from None
        except BaseException:
            self.state.release_claim(request.id, self.name, claimant)
            raise
        posted = PostState(channel=str(response["channel"]), ts=str(response["ts"]))
        return self._posted(posted, request, event.type, "posted")

    def _posted(self, posted: PostState, request: Request, what: str, how: str) -> str:
        """Remember the message, then bring it up to date if the request moved on meanwhile."""
        self.state.record_post(request.id, self.name, posted.channel or "", posted.ts or "")
        latest = self.broker.get_request(request.id)
        if fingerprint(latest) != fingerprint(request):
            self._update(posted, latest, what)
        return f"{what}: {how} {posted.ts}"

    def _find_posted(self, request: Request, since: float) -> PostState | None:
        """The message an earlier attempt posted for `request`, found by its metadata."""
        cursor: str | None = None
        for _ in range(LOOKUP_PAGES):
            try:
                response = self._call(
                    self.client.conversations_history,
                    channel=self.slack_channel,
                    oldest=f"{since - LOOKUP_MARGIN_S:.6f}",
                    include_all_metadata=True,
                    limit=200,
                    cursor=cursor,
                )
            except GiveUp as exc:
                log.warning(
                    "%s: cannot look for an earlier post of %s (%s); posting it again, which may"
                    " show it twice",
                    self.name,
                    request.id,
                    exc,
                )
                return None
            for message in response.get("messages") or []:
                meta = message.get("metadata") or {}
                payload = meta.get("event_payload") or {}
                if (
                    meta.get("event_type") == slack_ids.MESSAGE_EVENT_TYPE
                    and payload.get("request_id") == request.id
                    and message.get("ts")
                ):
                    return PostState(channel=self.slack_channel, ts=str(message["ts"]))
            cursor = (response.get("response_metadata") or {}).get("next_cursor") or None
            if cursor is None:
                return None
        return None

    def update_copy(self, copy: PostState, request: Request, what: str) -> str:
        """chat.update of a posted message (`channels.copies.CopyUpdater`)."""
        return self._update(copy, request, what)

    def _update(self, posted: PostState, request: Request, what: str) -> str:
        text, blocks = render(request, self.config, self.name)
        self._call(
            self.client.chat_update,
            channel=posted.channel,
            ts=posted.ts,
            text=text,
            blocks=blocks,
        )
        return f"{what}: updated {posted.ts}"

    def _call(self, method: Callable[..., SlackResponse], **kwargs: Any) -> SlackResponse:
        """One Web API call, with Slack's failures sorted into retry / give up.

        A Retry is `unclear` when Slack may have done what was asked although we saw a failure.
        """
        wait = self.not_before - time.monotonic()
        if wait > 0:
            raise Defer("Slack asked us to slow down", delay=pause_delay(wait))
        try:
            return method(**kwargs)
        except SlackApiError as exc:
            response = exc.response
            status = response.status_code
            data = response.data if isinstance(response.data, dict) else {}
            error = str(data.get("error") or f"HTTP {status}")
            if status == 429 or error == "ratelimited":
                headers = {k.lower(): v for k, v in (response.headers or {}).items()}
                value = headers.get("retry-after")
                if isinstance(value, list):
                    value = value[0] if value else None
                retry_after = cap_retry_after(parse_retry_after(value) or 1.0)
                self.not_before = max(self.not_before, time.monotonic() + retry_after)
                raise Retry("rate limited by Slack", retry_after=pause_delay(retry_after)) from None
            if status >= 500 or error in TRANSIENT_ERRORS:
                unclear = status >= 500 or error in UNCLEAR_ERRORS
                raise Retry(f"Slack answered {error}", unclear=unclear) from None
            raise GiveUp(f"Slack refused the call: {error}") from None
        except urllib.error.URLError as exc:  # failed before the request was fully sent
            raise Retry(f"Slack unreachable: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:  # sent; the answer never came
            detail = f"{type(exc).__name__}: {exc or 'no detail'}"
            raise Retry(f"no answer from Slack: {detail}", unclear=True) from None
        except SlackClientError as exc:
            raise Retry(f"Slack client error: {type(exc).__name__}: {exc}") from None
