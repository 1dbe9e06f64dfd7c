"""The one way to open a Redis client for the broker: impatient (API, CLI) or patient (roles).

Every client has a connect and a socket timeout, so a Redis that stalls (paused, overloaded,
a network path that drops packets) costs a caller a bounded wait and an error, never a hang:

- an impatient client (the API's, the CLI's) gives up after `SOCKET_TIMEOUT_S` per command and
  retries only a broken connection, once and at once (a pooled connection Redis closed by
  restarting); a timed-out command is never repeated, as it may have run;
- a patient client (the background roles) waits longer per command and rides out a restart:
  each command is retried with back-off, a bounded number of times (about half a minute).

A blocking read (XREAD BLOCK) must block for less than its client's socket timeout.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis import asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

CONNECT_TIMEOUT_S = 1.0
"""Opening a connection (TCP or Unix socket): a live Redis on the same network takes
milliseconds; a host that doesn't answer is given up on after this."""
SOCKET_TIMEOUT_S = 3.0
"""One command of an impatient client (the API answers 503 after it): well above any command
the API sends (each is one short step) and above its blocking reads (1 s), well below five
seconds. `/healthz` has its own, shorter bound (`api.health`)."""
PATIENT_CONNECT_TIMEOUT_S = 5.0
PATIENT_SOCKET_TIMEOUT_S = 30.0
"""One command of a patient client: its blocking reads (notifier `block_ms`, the resumer's and
live waits' reads) block for well under this; RQ raises it for its own dequeue as it needs."""
PATIENT_RETRIES = 25
PATIENT_ERRORS = [BusyLoadingError, RedisConnectionError, RedisTimeoutError]


def impatient_options() -> dict[str, Any]:
    """Keyword arguments for an impatient sync client (also what `connect` uses)."""
    return {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    }


def connect(url: str, *, patient: bool = False) -> Redis:
    """A Redis client for `url` (without `decode_responses`: the broker decodes what it reads).

    A `patient` client (the background roles) rides out a Redis restart: each command is retried
    with back-off for about half a minute while Redis is unreachable, stalled or loading.
    """
    if not patient:
        return Redis.from_url(url, **impatient_options())
    return Redis.from_url(
        url,
        socket_connect_timeout=PATIENT_CONNECT_TIMEOUT_S,
        socket_timeout=PATIENT_SOCKET_TIMEOUT_S,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), PATIENT_RETRIES),
        retry_on_error=PATIENT_ERRORS,
    )


def async_options() -> dict[str, Any]:
    """Keyword arguments for an impatient asyncio client (also what `connect_async` uses).

    Its connect timeout is the socket timeout, not CONNECT_TIMEOUT_S: an asyncio timeout runs
    on the loop's clock, and a loop working through a burst (3,000 runs started at once) took
    more than a second to get back to connections it had begun, which then failed as if Redis
    were down. A stalled Redis still fails a command within SOCKET_TIMEOUT_S.
    """
    return {
        "socket_connect_timeout": SOCKET_TIMEOUT_S,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "retry": AsyncRetry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    }


ASYNC_CONNECTIONS = 1000
"""Connections an asyncio client opens at most (one per command or pipeline in flight, plus
the blocking stream reads). redis.asyncio's default pool refuses the 101st at once
(`MaxConnectionsError`): 200 long-polls reading their runs together got 503s."""


def patient_async_options() -> dict[str, Any]:
    """Keyword arguments for a patient asyncio client: the patient sync client's (`connect`),
    so a background role's asyncio commands ride out a Redis restart as its sync ones do."""
    return {
        "socket_connect_timeout": PATIENT_CONNECT_TIMEOUT_S,
        "socket_timeout": PATIENT_SOCKET_TIMEOUT_S,
        "retry": AsyncRetry(ExponentialBackoff(cap=2.0, base=0.05), PATIENT_RETRIES),
        "retry_on_error": PATIENT_ERRORS,
    }


def connect_async(
    url: str | None = None, *, patient: bool = False, **connection: Any
) -> aredis.Redis:
    """An asyncio client for `url` (or for the `connection` keyword arguments: host, port,
    path for a Unix socket, password...) with the impatient client's timeouts and retry (or,
    `patient`, the patient one's).

    Its pool holds up to ASYNC_CONNECTIONS; a command that finds them all busy waits for one up
    to SOCKET_TIMEOUT_S (then a ConnectionError: the API's 503), never fails at once. A
    redis.asyncio client is bound to the event loop it first runs on: make one per loop.
    """
    limits = {"max_connections": ASYNC_CONNECTIONS, "timeout": SOCKET_TIMEOUT_S}
    timeouts = patient_async_options() if patient else async_options()
    options = {**connection, **timeouts, **limits}
    if url is not None:
        pool = aredis.BlockingConnectionPool.from_url(url, **options)
    elif "path" in connection:
        pool = aredis.BlockingConnectionPool(
            connection_class=aredis.UnixDomainSocketConnection, **options
        )
    else:
        pool = aredis.BlockingConnectionPool(**options)
    return aredis.Redis.from_pool(pool)
