"""One Redis connection for pipelined calls on asyncio, without a stream reader (issue 18).

`broker.deciding_async` writes a loop iteration's calls to Redis as one pipeline and reads the
replies in order. On redis.asyncio each reply was a coroutine of its own (a timeout context, a
stream reader woken, a parser read): in a CPU-time profile of an API process that reading and
writing was about a seventh of its CPU per decision. Here the connection is an asyncio protocol:
hiredis parses the bytes as they arrive (bulk strings decoded as `broker.text.as_str` does) and
each reply goes straight to the future of its call, in order; error replies become redis-py's
own exceptions (`NoScriptError`, ...). The handshake is redis-py's (HELLO 3 with AUTH, CLIENT
SETNAME, SELECT), with its errors and timeouts: a connection that fails or times out fails
every call still on it, as `redis.exceptions.ConnectionError` / `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any

import hiredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class Wire(asyncio.Protocol):
    """A connection to one Redis (`host`/`port`, or a Unix socket `path`) for `send`."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._timeout: float | None = kwargs.get("socket_timeout")
        self._reader = hiredis.Reader(encoding="utf-8", errors="replace")
        self._waiting: deque[tuple[asyncio.Future[Any], asyncio.Future[None] | None]] = deque()
        self._transport: asyncio.Transport | None = None
        self._lost: Exception | None = None
        self._heard = 0.0  # loop time of the last reply, for the read timeout
        self._timer: asyncio.TimerHandle | None = None

    @property
    def usable(self) -> bool:
        """Not failed or closed (a connection is never opened again: a new one is made)."""
        return self._lost is None

    @property
    def is_connected(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    @property
    def where(self) -> str:
        kwargs = self._kwargs
        return (
            kwargs["path"] if kwargs.get("path") else f"{kwargs.get('host')}:{kwargs.get('port')}"
        )

    async def connect(self) -> None:
        """Open the socket and say hello as redis-py does; raises redis's errors."""
        loop = asyncio.get_running_loop()
        kwargs = self._kwargs
        try:
            async with asyncio.timeout(kwargs.get("socket_connect_timeout")):
                if kwargs.get("path"):
                    await loop.create_unix_connection(lambda: self, kwargs["path"])
                else:
                    await loop.create_connection(
                        lambda: self, kwargs.get("host", "localhost"), kwargs.get("port", 6379)
                    )
        except TimeoutError:
            raise RedisTimeoutError(f"Timeout connecting to {self.where}") from None
        except OSError as exc:
            raise RedisConnectionError(f"Error connecting to {self.where}: {exc}") from None
        sock = self._transport.get_extra_info("socket") if self._transport else None
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await self._hello()
        except BaseException as exc:
            self.close()
            if isinstance(exc, ResponseError):  # no HELLO, an ACL without it: unavailable (503)
                raise RedisConnectionError(f"{self.where} refused the handshake: {exc}") from exc
            raise

    async def _hello(self) -> None:
        kwargs = self._kwargs
        hello: list[Any] = ["HELLO", 3]
        if kwargs.get("username") or kwargs.get("password"):
            hello += ["AUTH", kwargs.get("username") or "default", kwargs.get("password") or ""]
        commands = [hello]
        if kwargs.get("client_name"):
            commands.append(["CLIENT", "SETNAME", kwargs["client_name"]])
        if kwargs.get("db"):
            commands.append(["SELECT", kwargs["db"]])
        futures = [asyncio.get_running_loop().create_future() for _ in commands]
        try:
            await self.send([hiredis.pack_command(tuple(c)) for c in commands], futures)
        finally:
            for future in futures:  # ours: read each failure, the first is raised
                if future.done() and not future.cancelled():
                    future.exception()
        greeting = futures[0].result()
        if not isinstance(greeting, dict) or greeting.get("proto") != 3:
            raise RedisConnectionError("Invalid RESP version")
        for command, future in zip(commands[1:], futures[1:], strict=True):
            if future.result() != "OK":
                what = "Invalid Database" if command[0] == "SELECT" else "Error setting client name"
                raise RedisConnectionError(what)

    def send(self, packed: list[bytes], futures: list[asyncio.Future[Any]]) -> asyncio.Future[None]:
        """Write the packed commands as one; each reply goes to its future, in order. Returns
        a future done when the last reply is in (or failed with the connection's error)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if self._lost is not None or self._transport is None:
            error = self._lost or RedisConnectionError(f"not connected to {self.where}")
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            done.set_exception(error)
            done.exception()
            return done
        if not self._waiting:
            self._heard = loop.time()
        last = len(futures) - 1
        for i, future in enumerate(futures):
            self._waiting.append((future, done if i == last else None))
        if self._timeout is not None and self._timer is None:
            self._timer = loop.call_later(self._timeout, self._tick)
        self._transport.write(packed[0] if len(packed) == 1 else b"".join(packed))
        return done

    def _tick(self) -> None:
        """The read timeout: a connection that owes replies and heard nothing for
        `socket_timeout` fails (one timer per connection, armed again while it hears)."""
        self._timer = None
        if not self._waiting or self._lost is not None:
            return
        assert self._timeout is not None
        loop = asyncio.get_running_loop()
        left = self._heard + self._timeout - loop.time()
        if left <= 0:
            self._fail(RedisTimeoutError(f"Timeout reading from {self.where}"))
        else:
            self._timer = loop.call_later(left, self._tick)

    def close(self) -> None:
        self._fail(RedisConnectionError(f"connection to {self.where} closed"))

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader, waiting = self._reader, self._waiting
        try:
            reader.feed(data)
            reply = reader.gets()
            while reply is not False:
                future, done = waiting.popleft()
                if not future.done():
                    if isinstance(reply, hiredis.ReplyError):
                        future.set_exception(_error(str(reply)))
                    else:
                        future.set_result(reply)
                if done is not None and not done.done():
                    done.set_result(None)
                reply = reader.gets()
        except (hiredis.ProtocolError, IndexError) as exc:  # not Redis, or a reply unasked for
            self._fail(RedisConnectionError(f"protocol error from {self.where}: {exc}"))
            return
        self._heard = asyncio.get_running_loop().time()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"connection to {self.where} lost"))

    def _fail(self, error: Exception) -> None:
        """Fail every call still waiting, and close: this connection is not used again."""
        if self._lost is None:
            self._lost = error
        waiting, self._waiting = self._waiting, deque()
        for future, done in waiting:
            if not future.done():
                future.set_exception(self._lost)
            if done is not None and not done.done():
                done.set_exception(self._lost)
                done.exception()  # ours: its batch may be gone (cancelled), don't log it
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()


def _error(message: str) -> Exception:
    """redis-py's exception for an error reply (`NOSCRIPT ...` is `NoScriptError`, ...)."""
    error: Exception = BaseParser.parse_error(message)
    return error
