"""A batch of Redis commands sent and read on one connection, without redis-py's per-command
pipeline layers.

A busy notifier spent about a fifth of its GIL time in redis-py's `Pipeline` (queueing each
command, looking up its reply callback, parsing replies one by one into Python objects it then
threw away) for batches that are plain HGETALLs and one script call. Here a batch is packed in
one go (`pack`), written once and its replies read in order; an error reply comes back as the
`ResponseError` in its place, like `execute(raise_on_error=False)`.

Only a plain `redis.Redis` (with a connection pool to copy its settings from) qualifies (`for_client` gives None
otherwise: a cluster, a test double); callers keep their redis-py path for those.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from hiredis import pack_command
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError, ResponseError

from broker.scripts import sha_of

Command = Sequence[Any]


class LeanRedis:
    """Its own connection from the client's pool settings (made on first use; after a failure
    the same connection object connects again), shared under a lock by the few threads of one
    notifier part that call it: no pool checkout and return per batch."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._lock = threading.Lock()
        self._conn: Any = None
        self._closed = False

    @classmethod
    def for_client(cls, redis: Any) -> LeanRedis | None:
        if type(redis) is not Redis or not hasattr(redis.connection_pool, "make_connection"):
            return None
        return cls(redis)

    def execute(self, commands: list[Command], *, retry: bool = False) -> list[Any]:
        """The replies of `commands` in order; a connection that failed is dropped, and the
        error (ConnectionError, TimeoutError) raised, as redis-py would. `retry`: the batch
        is safe to send again (reads), so it rides out a Redis restart with the client's own
        retry policy, as the pipeline it replaces did."""
        if not commands:
            return []
        with self._lock:
            if self._closed:
                raise RedisConnectionError("this notifier's Redis connection is closed")
            if self._conn is None:
                self._conn = self.redis.connection_pool.make_connection()
            conn = self._conn
            if not retry:
                return self._send(conn, commands)
            return conn.retry.call_with_retry(
                lambda: self._send(conn, commands), lambda _error: conn.disconnect()
            )

    @staticmethod
    def _send(conn: Any, commands: list[Command]) -> list[Any]:
        try:
            conn.send_packed_command([pack(commands)])
            out: list[Any] = []
            for _ in commands:
                try:
                    out.append(conn.read_response())
                except ResponseError as exc:  # the reply was read whole: still in step
                    out.append(exc)
            return out
        except BaseException:
            conn.disconnect()
            raise

    def close(self) -> None:
        """Refuse further batches and drop the connection, without waiting for one in flight
        (it fails: a Redis that stopped answering must not hold up a notifier's stop)."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()


class LeanScript:
    """A Lua script called by SHA over `LeanRedis`, loaded when Redis doesn't know it (first
    use, a restarted or failed-over Redis)."""

    def __init__(self, lean: LeanRedis, source: str) -> None:
        self.lean = lean
        self.source = source
        self.sha = sha_of(source)

    def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        (reply,) = self.lean.execute([("EVALSHA", self.sha, len(keys), *keys, *args)])
        if isinstance(reply, NoScriptError):  # nothing ran
            self.sha = self.lean.redis.script_load(self.source)
            (reply,) = self.lean.execute([("EVALSHA", self.sha, len(keys), *keys, *args)])
        if isinstance(reply, Exception):
            raise reply
        return reply


_PLAIN = frozenset({str, int, float, bytes})


def pack(commands: list[Command]) -> bytes:
    """The commands in the Redis protocol, by hiredis's `pack_command` as `broker.redis_wire`
    and redis-py with hiredis write them. Only plain str, int, float and bytes are taken (every
    caller passes those): redis-py also takes some of their subclasses, and writes them
    differently with hiredis than without, so a subclass is refused here."""
    for command in commands:
        for arg in command:
            if type(arg) not in _PLAIN:
                raise DataError(
                    f"Invalid input of type: {type(arg).__name__!r} (plain str, int, float or bytes)"
                )
    return b"".join([pack_command(tuple(command)) for command in commands])


def as_mapping(reply: Any) -> dict[Any, Any]:
    """An HGETALL reply as a dict (RESP2 sends a flat list, RESP3 a map)."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))
