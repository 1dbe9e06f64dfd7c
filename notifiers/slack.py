"""Slack: one Block Kit message per request and channel, updated in place as the request moves.

The posted message is remembered in Redis as (channel, ts) before anything else happens, so a
redelivered event updates it rather than posting a second one. Posting is claimed first, so two
notifiers handling two events of one request at once never both post. A 429 pauses the whole
channel for its Retry-After; 5xx and connection errors are retried (slack_sdk retries quickly,
then the notifier's own back-off takes over).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry import ConnectionErrorRetryHandler
from slack_sdk.http_retry.builtin_handlers import ServerErrorRetryHandler
from slack_sdk.web import SlackResponse

from broker import slack_ids
from broker.client import Broker
from broker.config import Config, SlackConfig
from broker.models import Request
from notifiers.base import Channel
from notifiers.jobs import Task
from notifiers.retry import Defer, GiveUp, Retry, RetryPolicy, parse_retry_after
from notifiers.slack_blocks import fingerprint, render
from notifiers.state import DeliveryState, PostState

TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)


def slack_client(config: SlackConfig, timeout_s: float) -> WebClient:
    return WebClient(
        token=config.bot_token,
        base_url=config.api_base_url,
        timeout=int(max(1, timeout_s)),
        retry_handlers=[
            ConnectionErrorRetryHandler(max_retry_count=2),
            ServerErrorRetryHandler(max_retry_count=2),
        ],
    )


class SlackChannel(Channel):
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
    ) -> None:
        super().__init__(name, policy=policy, concurrency=concurrency)
        self.slack_channel = slack_channel
        self.client = client
        self.broker = broker
        self.config = config
        self.state = state
        self.consumer = consumer
        self.claim_stale_s = claim_stale_s

    def deliver(self, task: Task) -> str | None:
        event = task.event
        request = self.broker.get_request(event.request_id)
        found = self.state.post_state(request.id, self.name)
        if found.posted:
            return self._update(found, request, event.type)
        if event.moved_away:
            return None  # never posted in the queue it left: nothing to say there
        claimant = f"{self.consumer}:{secrets.token_hex(4)}"
        claimed, found = self.state.claim_post(request.id, self.name, claimant, self.claim_stale_s)
        if not claimed:
            if found.posted:
                return self._update(found, request, event.type)
            raise Defer("another notifier is posting this message", delay=0.5)
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
        except BaseException:
            self.state.release_claim(request.id, self.name, claimant)
            raise
        posted = PostState(channel=str(response["channel"]), ts=str(response["ts"]))
        self.state.record_post(request.id, self.name, posted.channel or "", posted.ts or "")
        latest = self.broker.get_request(request.id)
        if fingerprint(latest) != fingerprint(request):  # it moved on while we were posting
            self._update(posted, latest, event.type)
        return f"{event.type}: posted {posted.ts}"

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
        """One Web API call, with Slack's failures sorted into retry / give up."""
        wait = self.not_before - time.monotonic()
        if wait > 0:
            raise Defer("Slack asked us to slow down", delay=wait)
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
                retry_after = parse_retry_after(value) or 1.0
                self.not_before = max(self.not_before, time.monotonic() + retry_after)
                raise Retry("rate limited by Slack", retry_after=retry_after) from None
            if status >= 500 or error in TRANSIENT_ERRORS:
                raise Retry(f"Slack answered {error}") from None
            raise GiveUp(f"Slack refused the call: {error}") from None
        except (SlackClientError, OSError) as exc:
            raise Retry(f"Slack unreachable: {type(exc).__name__}: {exc}") from None
