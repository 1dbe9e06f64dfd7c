"""The one way to open a Redis client for the broker, impatient or riding out restarts."""

from __future__ import annotations

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry


def connect(url: str, *, patient: bool = False) -> Redis:
    """A Redis client for `url` (without `decode_responses`: the broker decodes what it reads).

    A `patient` client (the background roles) rides out a Redis restart: each command is retried
    with back-off for about half a minute while Redis is unreachable or loading.
    """
    if not patient:
        return Redis.from_url(url)
    return Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), 25),
        retry_on_error=[BusyLoadingError, RedisConnectionError, RedisTimeoutError],
    )
