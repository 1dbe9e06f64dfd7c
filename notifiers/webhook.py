"""Outbound webhooks, signed as Standard Webhooks (https://www.standardwebhooks.com/).

The body is `{"type", "timestamp", "data": <request>}`; `webhook-id` is the same on every try
of one event to one endpoint; `webhook-signature` carries one `v1,` signature per secret in
force, so receivers keep verifying during a secret rotation. 410 Gone switches the endpoint
off; anything else that is not 2xx is retried with back-off, then dead-lettered. A 429 or 503
with Retry-After pauses the whole endpoint for that long (capped), as Slack's 429 does.

Requests go through httpcore, the connection pool underneath httpx, used directly because it
costs half the CPU per request, and webhook throughput is CPU-bound. Each delivery thread has a
keep-alive pool of its own (one connection): one pool shared by every thread spends most of its
time on its lock, taken twice per request.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import httpcore
from standardwebhooks import Webhook

from broker.config import WebhookConfig
from broker.models import Request
from notifiers.base import Channel
from notifiers.delivery_state import DeliveryState
from notifiers.events import Event
from notifiers.retry import (
    GiveUp,
    Retry,
    RetryPolicy,
    cap_retry_after,
    parse_retry_after,
    pause_delay,
)
from notifiers.tasks import Task

USER_AGENT = "approval-broker-webhooks/1"
DISABLED_CACHE_S = 1.0


def webhook_body(event: Event, request: Request) -> str:
    """The contract body; `timestamp` is when the event happened, so retries send the same bytes."""
    head = json.dumps({"type": event.type, "timestamp": event.at.isoformat()})
    return f'{head[:-1]}, "data": {request.model_dump_json()}}}'


def signature_headers(
    msg_id: str, body: str, signers: list[Webhook], now: datetime | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers, signed now with every secret."""
    now = now or datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": " ".join(s.sign(msg_id, now, body) for s in signers),
    }


class WebhookChannel(Channel):
    kind = "webhook"

    def __init__(
        self,
        name: str,
        config: WebhookConfig,
        state: DeliveryState,
        *,
        concurrency: int,
        pool: httpcore.ConnectionPool | None = None,
    ) -> None:
        super().__init__(
            name,
            policy=RetryPolicy(config.max_attempts, config.backoff_s, config.max_backoff_s),
            concurrency=concurrency,
        )
        self.config = config
        self.state = state
        self.signers = [Webhook(secret) for secret in config.secrets]
        self._disabled: tuple[float, str | None] = (-DISABLED_CACHE_S, None)
        self._shared_pool = pool  # tests hand one in; otherwise one per delivery thread
        self._local = threading.local()
        self._pools: list[httpcore.ConnectionPool] = []
        self._pools_lock = threading.Lock()
        timeout = config.timeout_s
        self.extensions = {
            "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        }

    @property
    def pool(self) -> httpcore.ConnectionPool:
        """This thread's keep-alive pool (made on first use), or the one handed in."""
        if self._shared_pool is not None:
            return self._shared_pool
        pool = getattr(self._local, "pool", None)
        if pool is None:
            pool = httpcore.ConnectionPool(max_connections=1, max_keepalive_connections=1)
            self._local.pool = pool
            with self._pools_lock:
                self._pools.append(pool)
        return pool

    def disabled_reason(self) -> str | None:
        """Whether some notifier switched this endpoint off; looked up at most once a second."""
        looked_at, reason = self._disabled
        if time.monotonic() - looked_at >= DISABLED_CACHE_S:
            reason = self.state.disabled_reason(self.name)
            self._disabled = (time.monotonic(), reason)
        return reason

    def deliver(self, task: Task) -> str | None:
        disabled = self.disabled_reason()
        if disabled:
            raise GiveUp(f"{self.name} is disabled: {disabled}")
        body = task.memo("body", lambda: webhook_body(task.event, task.request))
        msg_id = task.event.webhook_id(self.name)
        headers = [
            ("content-type", "application/json"),
            ("user-agent", USER_AGENT),
            *signature_headers(msg_id, body, self.signers).items(),
        ]
        try:
            response = self.pool.request(
                "POST",
                self.config.url,
                headers=headers,
                content=body.encode(),
                extensions=self.extensions,
            )
        except httpcore.UnsupportedProtocol as exc:
            raise GiveUp(f"{self.name} has an unusable URL: {exc}") from None
        except (
            httpcore.TimeoutException,
            httpcore.NetworkError,
            httpcore.ProtocolError,
            OSError,
        ) as exc:
            raise Retry(f"{type(exc).__name__}: {exc or 'no detail'}") from None
        status = response.status
        if 200 <= status < 300:
            return f"{task.event.type} -> HTTP {status} ({msg_id})"
        if status == 410:
            self.state.disable(self.name, "the endpoint answered 410 Gone")
            self._disabled = (time.monotonic(), "the endpoint answered 410 Gone")
            raise GiveUp(f"{self.name} answered 410 Gone; the endpoint is now disabled")
        retry_after = parse_retry_after(header(response, b"retry-after"))
        if retry_after is not None and status in (429, 503):
            # the endpoint is overloaded, not just this delivery: pause all of its tasks
            retry_after = cap_retry_after(retry_after)
            self.not_before = max(self.not_before, time.monotonic() + retry_after)
            retry_after = pause_delay(retry_after)
        raise Retry(f"HTTP {status} from {self.name}", retry_after=retry_after)

    def close(self) -> None:
        if self._shared_pool is not None:
            self._shared_pool.close()
        with self._pools_lock:
            pools, self._pools = self._pools, []
        for pool in pools:
            pool.close()


def header(response: httpcore.Response, name: bytes) -> str | None:
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
