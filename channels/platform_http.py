"""One HTTP call to a chat platform's API (Telegram's Bot API, Discord's REST API) over httpx,
with its failures sorted the way every delivery sorts them (`channels.retry`).

- a 429 pauses the whole channel for the `retry_after` the platform gives (Telegram's
  `parameters.retry_after`, Discord's `retry_after` or the Retry-After header), capped, and
  the task waits it out with jitter;
- a 5xx, a connection error or a timeout is retried with the notifier's back-off (`unclear`
  when the request may have been acted on);
- any other refusal (a bad token, a chat the bot is not in) dead-letters the delivery.

Never logs or returns the URL: Telegram's carries the bot token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from channels.retry import (
    Defer,
    GiveUp,
    Retry,
    cap_retry_after,
    parse_retry_after,
    pause_delay,
)
from channels.sender import Sender


def body_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON object a platform answered with ({} for anything else)."""
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def call(
    channel: Sender,
    platform: str,
    send: Callable[[], httpx.Response],
    retry_after: Callable[[httpx.Response, dict[str, Any]], float | None],
    describe: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """Send one call for `channel`; its JSON body on a 2xx, else Retry / GiveUp / Defer."""
    wait = channel.not_before - time.monotonic()
    if wait > 0:
        raise Defer(f"{platform} asked us to slow down", delay=pause_delay(wait))
    try:
        response = send()
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise Retry(f"{platform} unreachable: {type(exc).__name__}") from None
    except httpx.HTTPError as exc:  # sent; the answer never came
        raise Retry(f"no answer from {platform}: {type(exc).__name__}", unclear=True) from None
    data = body_of(response)
    status = response.status_code
    if status == 429:
        seconds = cap_retry_after(retry_after(response, data) or 1.0)
        channel.not_before = max(channel.not_before, time.monotonic() + seconds)
        raise Retry(f"rate limited by {platform}", retry_after=pause_delay(seconds))
    if status >= 500:
        raise Retry(f"{platform} answered HTTP {status}", unclear=True)
    if status >= 300:
        raise GiveUp(f"{platform} refused the call: HTTP {status} {describe(data)}")
    return data


def header_retry_after(response: httpx.Response) -> float | None:
    return parse_retry_after(response.headers.get("retry-after"))
