"""The decision service's hot path on redis.asyncio: one round trip per ordinary decision.

`Deciding.decide` reads the request, judges it, then runs the atomic step: two round trips, on
a thread. Here the ordinary case (approve, modify or reject a pending request, by someone who
may, through a channel of its queue) is one decide.lua call whose `fast` checks are what the
service would judge from the stored request (the queue's roles and channels, `allowed_roles`,
the creator, a tool's args schema); the step judges the rest as always (pending, kind,
args_hash, the quorum, the one-time marker). Whatever the step can't settle that way writes
nothing and comes back as None with the request it saw: the caller asks the full service then,
whose answer is the one every channel gets (issue 18; `tests/test_hotapi.py`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Collection, Sequence
from typing import Any

from hiredis import pack_command
from redis import Redis
from redis.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from broker.auth import EVERY_ROLE, Principal
from broker.deciding import Decided, Deciding, person_of
from broker.models import Decision, Outcome, Request
from broker.printable import printable
from broker.quorum import is_approval
from broker.redis_wire import Wire
from broker.request_hash import parse_flat
from broker.scripts import sha_of, source

HOT = (Outcome.approved, Outcome.modified, Outcome.rejected)
"""Outcomes judged in one step; an answer (its schema) and an escalation (its chain, its
repeats) go to the full service."""
FINAL = ("ok", "voted", "repeat")
_KWARGS = ("host", "port", "db", "username", "password", "path", "client_name")
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")


MAX_CONNECTIONS = 16
"""Per API process and loop: a burst on a slow Redis waits for one of these, it doesn't open
one per loop iteration (each batch holds its connection until its replies are read)."""


class Connections:
    """Calls to one Redis on lean asyncio connections, the calls of one loop tick sent together.

    Each call is packed and queued; once per loop iteration the queue goes out on one idle
    connection as one write (a pipeline of independent commands, not a transaction), and each
    reply goes to its call's future as it is parsed (`broker.redis_wire.Wire`). Under load many
    decisions share a write and a read: in a py-spy profile the socket calls that wake Redis
    were a third of the API's CPU, and redis-py's per-command layers (pool lock, retry wrapper,
    encoder, a stream reader and a timeout per reply) much of the rest. At most
    `max_connections` are open: a batch finding none idle waits for one. A connection that
    fails fails the calls on it and is dropped; timeouts are the sync client's. `aclose`
    closes every connection, busy ones too (their calls fail), and fails what still waits.
    A Unix socket's `kwargs` name its `path`, TCP's `host` and `port`.
    """

    def __init__(
        self,
        kwargs: dict[str, Any],
        sent: Any = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._kwargs, self._sent = kwargs, sent
        self._max = max_connections
        self._idle: list[Wire] = []
        self._open: set[Wire] = set()
        self._waiting: deque[asyncio.Future[Wire]] = deque()
        self._queue: list[tuple[bytes, asyncio.Future[Any]]] = []
        self._batches: set[asyncio.Task[None]] = set()
        self._closed = False
        self.opened = 0
        """Connections made so far (for tests and the benchmarks)."""

    @property
    def connected(self) -> int:
        """Connections open to Redis now, idle or busy."""
        return sum(1 for conn in self._open if conn.is_connected)

    async def call(self, *args: str | bytes | int) -> Any:
        if self._closed:
            raise _closed_error()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._flush)
        self._queue.append((pack_command(args), future))
        return await future

    def _flush(self) -> None:
        batch, self._queue = self._queue, []
        if not batch:  # failed by aclose meanwhile
            return
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _acquire(self) -> Wire:
        if self._closed:  # a batch flushed after aclose: nothing goes out any more
            raise _closed_error()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
            self._open.discard(conn)  # Redis closed it while it was idle: never reused
        if len(self._open) < self._max:
            return self._new_connection()
        waiter: asyncio.Future[Wire] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            conn = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(waiter.result())  # handed over as we were cancelled: pass it on
            raise
        if conn.usable:
            return conn
        self._open.discard(conn)  # Redis closed it after it was handed over: a new one instead
        return self._new_connection()

    def _new_connection(self) -> Wire:
        """A connection counted as open (it connects on first use)."""
        conn = Wire(**self._kwargs)
        self._open.add(conn)
        self.opened += 1
        return conn

    def _release(self, conn: Wire | None) -> None:
        """Hand `conn` to the next waiting batch, or keep it idle; None: it was dropped, so a
        waiting batch may open a new one."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if waiter.done():
                continue
            waiter.set_result(self._new_connection() if conn is None else conn)
            return
        if conn is not None:
            self._idle.append(conn)

    async def _send(self, batch: list[tuple[bytes, asyncio.Future[Any]]]) -> None:
        conn: Wire | None = None
        try:
            conn = await self._acquire()
            if not conn.is_connected and conn.usable:  # new: it connects on first use
                await conn.connect()
            if self._sent is not None:
                self._sent()
            await conn.send([packed for packed, _ in batch], [future for _, future in batch])
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else RedisConnectionError("closed")
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            if conn is not None:
                self._open.discard(conn)
                conn.close()
                if not self._closed:
                    self._release(None)
            if not isinstance(exc, Exception):
                raise
            return
        if self._closed:
            self._open.discard(conn)
            conn.close()
        else:
            self._release(conn)

    async def aclose(self) -> None:
        """Close every connection, idle or busy; calls in flight or waiting fail."""
        self._closed = True
        queued, self._queue = self._queue, []  # their flush is scheduled: fail them now
        for _, future in queued:
            if not future.done():
                future.set_exception(_closed_error())
        for waiter in self._waiting:
            if not waiter.done():
                waiter.cancel()
        self._waiting.clear()
        batches = list(self._batches)
        for task in batches:
            task.cancel()
        if batches:
            await asyncio.gather(*batches, return_exceptions=True)
        idle, self._idle = self._idle, []
        for conn in [*idle, *self._open]:
            conn.close()
        self._open.clear()


def _closed_error() -> RedisConnectionError:
    """What a call gets once `Connections.aclose` ran: redis's own error, so the API answers 503."""
    return RedisConnectionError("the hot path's Redis connections are closed")


def async_twin(redis: Any, sent: Any = None) -> Connections | None:
    """Connections to the same Redis as the sync client `redis`, with its timeouts; None when
    it isn't a plain one (a cluster, TLS, a credential provider, a test double)."""
    if type(redis) is not Redis:
        return None
    pool = redis.connection_pool
    kwargs: dict[str, Any] = pool.connection_kwargs
    if pool.connection_class not in (Connection, UnixDomainSocketConnection):
        return None  # TLS, or a connection class of the user's own
    if kwargs.get("credential_provider") is not None:
        return None
    picked = {k: kwargs[k] for k in (*_KWARGS, *_TIMEOUTS) if kwargs.get(k) is not None}
    return Connections(picked, sent)


class AsyncDeciding:
    """`Deciding`'s ordinary decisions in one awaited step; None: ask `Deciding` itself."""

    def __init__(self, deciding: Deciding) -> None:
        self.deciding = deciding
        self.broker = deciding.broker
        self._sha = sha_of(source("decide"))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._redis: Connections | None = None
        self._who: dict[tuple[frozenset[str], tuple[str, ...]], dict[str, Any]] = {}

    def client(self) -> Connections | None:
        """The client of the running loop (a test client may run each request on a new one)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._redis = loop, async_twin(self.broker.redis, self._count)
        return self._redis

    async def aclose(self) -> None:
        if self._redis is not None and self._loop is asyncio.get_running_loop():
            await self._redis.aclose()
        self._loop = self._redis = None

    async def decide(
        self,
        request_id: str,
        decision: Decision,
        principal: Principal,
        *,
        via: Sequence[str],
        decided_by: str | None = None,
        once: tuple[str, int] | None = None,
    ) -> tuple[Decided | None, Request | None]:
        """(the decision, None) when the step settled it; (None, the request as the step saw
        it, or None) when the full service must judge, with nothing written."""
        if decision.outcome not in HOT or len(via) != 1 or self.broker.store.clustered:
            return None, None
        client = self.client()
        if client is None:
            return None, None
        decided_by = printable(decided_by or principal.name)
        every = EVERY_ROLE in principal.roles
        fast = {
            **self.who(principal, via),
            "approval": is_approval(decision),
            "person": person_of(decided_by),
        }
        if decision.outcome is Outcome.modified and decision.args is not None:
            fast["check_args"] = True
        keys, argv = self.broker.decisions.fast_call(
            request_id,
            decision,
            decided_by=decided_by,
            channel=via[0],
            creator_may_vote=every,
            once=once,
            fast=fast,
        )
        result = await self._evalsha(client, keys, argv)
        code = result[0]
        if code not in FINAL:
            seen = parse_flat(result[2:]) if code == "judge" else None
            return None, seen
        request = self.broker.decisions.outcome(result, request_id, decision)
        return Decided(request, recorded=code != "repeat"), None

    def who(self, principal: Principal, via: Collection[str]) -> dict[str, Any]:
        """The queues `principal` may decide in through `via` and its roles, as `fast` args
        (`Deciding.refusal` judges the same: a queue's roles, then its channels)."""
        cache_key = (principal.roles, tuple(via))
        found = self._who.get(cache_key)
        if found is None:
            if EVERY_ROLE in principal.roles:
                found = {"any_queue": True}
            else:
                config = self.deciding.config
                queues = {
                    name: True
                    for name, queue in config.queues.items()
                    if principal.decides_anything()
                    and (not queue.roles or principal.roles.intersection(queue.roles))
                    and set(via).intersection(queue.channels)
                }
                found = {"queues": queues, "roles": dict.fromkeys(principal.roles, True)}
            self._who[cache_key] = found
        return found

    def _count(self) -> None:
        """Round trips are counted by the benchmarks from Redis's side (`bench/benchlib.py`)."""

    async def _evalsha(self, client: Connections, keys: list[str], argv: str) -> list[Any]:
        try:
            reply = await client.call("EVALSHA", self._sha, len(keys), *keys, argv)
        except NoScriptError:  # a new or flushed Redis: load it (nothing ran) and call again
            await client.call("SCRIPT", "LOAD", source("decide"))
            reply = await client.call("EVALSHA", self._sha, len(keys), *keys, argv)
        return reply  # type: ignore[no-any-return]  # decoded as as_str does (broker.redis_wire)
