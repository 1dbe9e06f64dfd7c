"""Helpers the notifier tests share: configs that point at the fakes, and a running notifier."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from broker.facade import Broker
from notifiers.consumer import Notifier
from notifiers.options import NotifierOptions
from notifiers.runner import start_notifier

SECRET = "whsec_" + base64.b64encode(b"notifier-tests-secret-0123456789").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"notifier-tests-old-secret-012345").decode()
WRONG_SECRET = "whsec_" + base64.b64encode(b"somebody-elses-secret-0123456789").decode()


def webhook(url: str, secret: str | list[str] = SECRET, **extra: Any) -> dict[str, Any]:
    """A [webhooks.NAME] section with quick retries, fit for tests."""
    return {
        "url": url,
        "secret": secret,
        "max_attempts": 3,
        "backoff_s": 0.05,
        "max_backoff_s": 0.2,
        "timeout_s": 5,
        **extra,
    }


def options(**overrides: Any) -> NotifierOptions:
    """Fast polling and short back-off, so tests finish in well under a second each."""
    base: dict[str, Any] = {
        "claim_idle_s": 2.0,
        "block_ms": 50,
        "backoff_s": 0.05,
        "max_backoff_s": 0.2,
        "shutdown_grace_s": 2.0,
        "workers": 4,
        "slack_timeout_s": 1.0,  # an unclear Slack failure is looked up after this long
    }
    return NotifierOptions(**(base | overrides))


@contextmanager
def running(broker: Broker, **overrides: Any) -> Iterator[Notifier]:
    notifier = start_notifier(broker, options(**overrides))
    try:
        yield notifier
    finally:
        notifier.stop()
