"""How a failed delivery is retried: exponential back-off with jitter, honouring Retry-After."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

RETRY_AFTER_LIMIT_S = 3600.0  # a Retry-After beyond this is treated as this
PAUSE_JITTER_S = 1.0  # tasks waiting out one pause wake spread over up to this long


class Retry(Exception):
    """This attempt failed but a later one may work (5xx, 429, timeouts, connection errors).

    `unclear`: the far end may have acted on the request although we saw a failure (a timeout
    or a reset after sending, a 5xx), so a blind resend could do it twice.
    """

    def __init__(
        self, message: str, *, retry_after: float | None = None, unclear: bool = False
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.unclear = unclear


class GiveUp(Exception):
    """No retry can help (bad token, endpoint gone): dead-letter the delivery now."""


class Defer(Exception):
    """Not a failure: someone else is busy with this (e.g. posting it); look again later."""

    def __init__(self, message: str, *, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    base_s: float
    cap_s: float

    def delay(
        self,
        attempt: int,
        retry_after: float | None = None,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based).

        "Equal jitter": half the exponential step is fixed, half random, so retries from many
        notifiers spread out yet still back off. A server's Retry-After is a floor.
        """
        step = min(self.cap_s, self.base_s * 2.0 ** (attempt - 1))
        wait = step / 2 + rand() * step / 2
        if retry_after is not None:
            wait = max(wait, cap_retry_after(retry_after))
        return wait


def cap_retry_after(seconds: float) -> float:
    """A server's Retry-After, never negative and never beyond RETRY_AFTER_LIMIT_S."""
    return min(max(0.0, seconds), RETRY_AFTER_LIMIT_S)


def pause_delay(wait: float, rand: Callable[[], float] = random.random) -> float:
    """How long one task waits out a channel-wide pause of `wait` seconds.

    Every task of a paused channel would otherwise wake at the same instant and hit the far end
    together; each gets up to a tenth of the pause (at most PAUSE_JITTER_S) on top.
    """
    return wait + rand() * min(PAUSE_JITTER_S, max(0.05, wait / 10))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: either delta-seconds or an HTTP date; None if unusable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
