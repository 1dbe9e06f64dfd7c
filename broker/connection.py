"""The one way to open a Redis client for the broker, impatient or riding out restarts.

For benchmarks, `APPROVAL_BROKER_COUNT_ROUND_TRIPS=DIR` makes every client opened here count
its round trips (one per command sent alone, one per pipeline) and write the process's total to
`DIR/{pid}.json` on SIGUSR1 (about once a second where it can't take that signal). Off, it
costs nothing.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

COUNT_ENV = "APPROVAL_BROKER_COUNT_ROUND_TRIPS"


def connect(url: str, *, patient: bool = False) -> Redis:
    """A Redis client for `url` (without `decode_responses`: the broker decodes what it reads).

    A `patient` client (the background roles) rides out a Redis restart: each command is retried
    with back-off for about half a minute while Redis is unreachable or loading.
    """
    if not patient:
        client = Redis.from_url(url)
    else:
        client = Redis.from_url(
            url,
            retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), 25),
            retry_on_error=[BusyLoadingError, RedisConnectionError, RedisTimeoutError],
        )
    if os.environ.get(COUNT_ENV):
        RoundTrips.shared(Path(os.environ[COUNT_ENV])).watch(client)
    return client


class RoundTrips:
    """Counts the round trips of a process's clients (benchmarks only)."""

    _shared: RoundTrips | None = None

    def __init__(self, out: Path) -> None:
        self.out = out
        self.round_trips = 0
        self._lock = threading.Lock()
        out.mkdir(parents=True, exist_ok=True)
        self.write()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, lambda *_: self.write())
        else:
            threading.Thread(target=self._write_loop, name="round-trips", daemon=True).start()

    @classmethod
    def shared(cls, out: Path) -> RoundTrips:
        if cls._shared is None:
            cls._shared = cls(out)
        return cls._shared

    def watch(self, client: Redis) -> None:
        pool = client.connection_pool
        make = pool.make_connection

        def make_connection() -> Any:
            connection = make()
            send = connection.send_packed_command

            def counted(command: Any, check_health: bool = True) -> None:
                with self._lock:
                    self.round_trips += 1
                send(command, check_health)

            connection.send_packed_command = counted
            return connection

        pool.make_connection = make_connection  # type: ignore[method-assign]

    def write(self) -> None:
        path = self.out / f"{os.getpid()}.json"
        path.with_suffix(".tmp").write_text(json.dumps({"round_trips": self.round_trips}))
        path.with_suffix(".tmp").replace(path)

    def _write_loop(self) -> None:
        while True:
            self.write()
            threading.Event().wait(1.0)
