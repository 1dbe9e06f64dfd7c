"""Outbound webhooks, signed as Standard Webhooks (https://www.standardwebhooks.com/).

The body is `{"type", "timestamp", "data": <request>}`; `webhook-id` is the same on every try
of one event to one endpoint; `webhook-signature` carries one `v1,` signature per secret in
force, so receivers keep verifying during a secret rotation. 410 Gone switches the endpoint
off; anything else that is not 2xx is retried with back-off, then dead-lettered. A 429 or 503
with Retry-After pauses the whole endpoint for that long (capped), as Slack's 429 does.

Requests go out with httpx's API on aiohttp's connections (channels.webhook.http): one overall
deadline per delivery (the endpoint's `timeout_s`), a bounded answer, no redirects followed,
proxies from the environment.
The body is built from the stored request without a `Request` model (the router's
`StoredRequest`, from the core's request store).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime

import httpx
from standardwebhooks import Webhook

from broker.domain.events import EVENT_TYPES, Event
from broker.domain.models import Request
from broker.facade import DeliveryState
from broker.tracing import telemetry as tracing
from channels.retry import (
    GiveUp,
    Retry,
    RetryPolicy,
    cap_retry_after,
    parse_retry_after,
    pause_delay,
)
from channels.sender import Delivery, Sender
from channels.webhook.config import WebhookConfig
from channels.webhook.http import Answer, AnswerTooLarge, Poster, UnusableURL, tls_context

USER_AGENT = "approval-broker-webhooks/1"
DISABLED_CACHE_S = 1.0


def webhook_body(event: Event, request: Request) -> str:
    """The contract body; `timestamp` is when the event happened, so retries send the same bytes."""
    return f"{_head(event)}{request.model_dump_json()}}}"


def delivery_body(delivery: Delivery) -> bytes:
    """`webhook_body` of a delivery's event and request, from the request's stored fields when
    the notifier kept them (`Delivery.request_json`): the same bytes, without a `Request` model."""
    data = delivery.request_json()
    if data is None:
        return webhook_body(delivery.event, delivery.request).encode()
    return b"%s%s}" % (_head(delivery.event).encode(), data)


def _head(event: Event) -> str:
    """`{"type": ..., "timestamp": ..., "data": ` as `json.dumps` writes it (an event type of
    ours and an ISO time need no escaping)."""
    if event.type in EVENT_TYPES:
        return f'{{"type": "{event.type}", "timestamp": "{event.at.isoformat()}", "data": '
    head = json.dumps({"type": event.type, "timestamp": event.at.isoformat()})
    return f'{head[:-1]}, "data": '


class Signer:
    """One secret's Standard Webhooks signature of a body, by `standardwebhooks.Webhook.sign`."""

    def __init__(self, secret: str) -> None:
        self._webhook = Webhook(secret)

    def sign(self, msg_id: str, timestamp: int, body: bytes) -> str:
        at = datetime.fromtimestamp(timestamp, UTC)
        return self._webhook.sign(msg_id, at, body.decode("utf-8"))


def signature_headers(
    msg_id: str, body: bytes, signers: list[Signer], stamp: int | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers, signed now (or at `stamp`) with every secret."""
    stamp = int(time.time()) if stamp is None else stamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": " ".join(s.sign(msg_id, stamp, body) for s in signers),
    }


class WebhookSender(Sender):
    kind = "webhook"

    def __init__(
        self,
        name: str,
        config: WebhookConfig,
        state: DeliveryState,
        *,
        concurrency: int,
    ) -> None:
        super().__init__(
            name,
            policy=RetryPolicy(config.max_attempts, config.backoff_s, config.max_backoff_s),
            concurrency=concurrency,
        )
        self.config = config
        self.state = state
        self.signers = [Signer(secret) for secret in config.secrets]
        self._disabled: tuple[float, str | None] = (-DISABLED_CACHE_S, None)
        self._posters: list[Poster] = []
        self._posters_lock = threading.Lock()
        self._events = frozenset(config.events) if config.events is not None else None
        tls_context()  # loaded now, not on a delivery's deadline

    def wants(self, event: Event) -> bool:
        """Every event type unless the endpoint's `events` names the ones it is sent."""
        return self._events is None or event.type in self._events

    @property
    def poster(self) -> Poster:
        """The endpoint's client (made on first use); `UnusableURL` for a URL no try could
        reach."""
        with self._posters_lock:
            if not self._posters:
                self._posters.append(
                    Poster(self.config.url, self.config.timeout_s, connections=self.concurrency)
                )
            return self._posters[0]

    def disabled_reason(self) -> str | None:
        """Whether some notifier switched this endpoint off; looked up at most once a second."""
        looked_at, reason = self._disabled
        if time.monotonic() - looked_at >= DISABLED_CACHE_S:
            reason = self.state.disabled_reason(self.name)
            self._disabled = (time.monotonic(), reason)
        return reason

    def deliver(self, delivery: Delivery) -> str | None:
        disabled = self.disabled_reason()
        if disabled:
            raise GiveUp(f"{self.name} is disabled: {disabled}")
        raw, msg_id, headers = self._request(delivery)
        try:
            answer = self.poster.post(raw, headers)
        except Exception as exc:  # noqa: BLE001 - `_failure` names what each one means
            raise self._failure(exc) from None
        if answer.status == 410:
            self._gone()
        return self._answered(delivery, answer, msg_id)

    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The endpoint's client's loop (its attempts run there); None for a URL no try could
        reach or a closed sender (`deliver` says why)."""
        try:
            return self.poster.loop()
        except (UnusableURL, httpx.TransportError):
            return None

    async def adeliver(self, delivery: Delivery) -> str | None:
        """`deliver` on the endpoint's loop; its rare Redis calls (whether the endpoint was
        switched off, once a second at most; switching it off) in a thread."""
        looked_at, disabled = self._disabled
        if time.monotonic() - looked_at >= DISABLED_CACHE_S:
            disabled = await asyncio.to_thread(self.disabled_reason)
        if disabled:
            raise GiveUp(f"{self.name} is disabled: {disabled}")
        raw, msg_id, headers = self._request(delivery)
        try:
            answer = await self.poster.apost(raw, headers)
        except Exception as exc:  # noqa: BLE001 - `_failure` names what each one means
            raise self._failure(exc) from None
        if answer.status == 410:
            await asyncio.to_thread(self._gone)
        return self._answered(delivery, answer, msg_id)

    def _request(self, delivery: Delivery) -> tuple[bytes, str, dict[str, str]]:
        """The body (the same bytes on every try), its `webhook-id` and the signed headers."""
        raw = delivery.scratch.get("raw")
        if raw is None:
            body = delivery.scratch.get("body")
            raw = body.encode() if body is not None else delivery_body(delivery)
            delivery.scratch["raw"] = raw
        msg_id = delivery.event.webhook_id(self.name)
        headers = {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "accept-encoding": "identity",
            **signature_headers(msg_id, raw, self.signers),
            **tracing.headers(),  # the delivery's span: the receiver's trace goes on from it
        }
        return raw, msg_id, headers

    def _failure(self, exc: Exception) -> Exception:
        """What a POST that raised `exc` means: give up (the URL can never work) or retry."""
        if isinstance(exc, UnusableURL):
            return GiveUp(f"{self.name} has an unusable URL: {exc}")
        if isinstance(exc, TimeoutError):
            return Retry(f"no whole answer within {self.config.timeout_s:g}s")
        if isinstance(exc, httpx.HTTPError | AnswerTooLarge | OSError):
            return Retry(f"{type(exc).__name__}: {exc or 'no detail'}")
        return exc

    def _gone(self) -> None:
        """410 Gone: the endpoint is switched off for every notifier (a Redis write)."""
        self.state.disable(self.name, "the endpoint answered 410 Gone")
        self._disabled = (time.monotonic(), "the endpoint answered 410 Gone")

    def _answered(self, delivery: Delivery, answer: Answer, msg_id: str) -> str:
        """The history note of a 2xx; else the GiveUp or Retry the status means."""
        status = answer.status
        if 200 <= status < 300:
            return f"{delivery.event.type} -> HTTP {status} ({msg_id})"
        if status == 410:
            raise GiveUp(f"{self.name} answered 410 Gone; the endpoint is now disabled")
        retry_after = parse_retry_after(answer.retry_after)
        if retry_after is not None and status in (429, 503):
            # the endpoint is overloaded, not just this delivery: pause all of its tasks
            retry_after = cap_retry_after(retry_after)
            self.not_before = max(self.not_before, time.monotonic() + retry_after)
            retry_after = pause_delay(retry_after)
        raise Retry(f"HTTP {status} from {self.name}", retry_after=retry_after)

    def close(self) -> None:
        with self._posters_lock:
            posters, self._posters = self._posters, []
        for poster in posters:
            poster.close()
