"""Waiting for a condition by polling it, never by sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.support.backends import (  # noqa: F401 - fixtures the modules on both backends build on
    backend_param,
    on_backend_connect,
    on_backend_env,
    on_backend_make_broker,
    on_backend_rq,
)


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll until `predicate()` is truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
