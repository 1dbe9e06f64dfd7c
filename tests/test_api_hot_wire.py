"""The hot path's lean Redis connections (`broker.redis_wire`, behind `Connections`) behave as
the redis.asyncio ones they replace: replies in order and decoded as `as_str` decodes,
redis-py's exceptions for error replies, its handshake (client name, database), and a
connection that can't be reached, times out or is closed fails its calls with redis's own
connection errors (the API answers those 503), then is not used again.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.deciding_async import Connections, async_twin
from broker.redis_wire import Wire


def kwargs_of(redis: Redis, **more: Any) -> dict[str, Any]:
    given = redis.connection_pool.connection_kwargs
    picked = {k: given[k] for k in ("host", "port", "password", "db") if given.get(k) is not None}
    return {**picked, **more}


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_replies_come_back_in_order_decoded_and_errors_as_redis_py_raises_them(
    redis: Redis,
) -> None:
    redis.set("t:wire:bytes", b"ok \xff")

    async def scenario() -> list[Any]:
        conns = Connections(kwargs_of(redis))
        calls = [
            conns.call("SET", "t:wire:a", "1"),
            conns.call("GET", "t:wire:a"),
            conns.call("GET", "t:wire:bytes"),
            conns.call("EVALSHA", "0" * 40, 0),
            conns.call("INCRBY", "t:wire:a", "not a number"),
            conns.call("EVAL", "return {1, 'two', {3}}", 0),
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        opened = conns.opened
        await conns.aclose()
        return [*results, opened]

    ok, one, decoded, noscript, wrong, table, opened = run(scenario())
    assert (ok, one, decoded) == ("OK", "1", "ok \ufffd")  # as broker.text.as_str decodes
    assert isinstance(noscript, NoScriptError)
    assert isinstance(wrong, ResponseError) and not isinstance(wrong, NoScriptError)
    assert table == [1, "two", [3]]
    assert opened == 1  # one loop iteration: one connection, one write


def test_the_handshake_names_the_client_and_selects_the_database(redis: Redis) -> None:
    redis.delete("t:wire:db")
    db = 3 if redis.connection_pool.connection_kwargs.get("db") != 3 else 4

    async def scenario() -> tuple[Any, Any]:
        conns = Connections(kwargs_of(redis, db=db, client_name="hot-wire"))
        name = await conns.call("CLIENT", "GETNAME")
        await conns.call("SET", "t:wire:db", "in 3")
        await conns.aclose()
        return name, None

    name, _ = run(scenario())
    assert name == "hot-wire"
    assert redis.get("t:wire:db") is None
    other = Redis(**kwargs_of(redis, db=db))
    try:
        assert other.get("t:wire:db") == b"in 3"
        other.delete("t:wire:db")
    finally:
        other.close()


def test_the_twin_of_the_sync_client_uses_its_database_and_timeouts(redis: Redis) -> None:
    sync = Redis(**kwargs_of(redis, db=2), socket_timeout=4.0)
    try:
        twin = async_twin(sync)
        assert twin is not None
        wire = twin._new_connection()
        assert isinstance(wire, Wire) and wire._timeout == 4.0
        assert run(_ping_db(twin)) == 2
    finally:
        sync.close()


async def _ping_db(conns: Connections) -> int:
    info = await conns.call("CLIENT", "INFO")
    await conns.aclose()
    return int(info.split(" db=", 1)[1].split(" ", 1)[0])


def ping_failure(kwargs: dict[str, Any]) -> BaseException | None:
    """What a PING over fresh connections with `kwargs` failed with (None: it didn't)."""

    async def scenario() -> BaseException | None:
        conns = Connections(kwargs)
        try:
            await conns.call("PING")
        except Exception as exc:  # noqa: BLE001 - what it failed with
            return exc
        finally:
            await conns.aclose()
        return None

    return run(scenario())


def test_a_wrong_password_fails_the_call_as_a_connection_error(redis: Redis) -> None:
    failure = ping_failure(kwargs_of(redis, password="wrong-password"))
    if failure is None:
        pytest.skip("this Redis takes any password (none is set)")
    assert isinstance(failure, RedisConnectionError)


def test_a_handshake_redis_refuses_is_a_connection_error_not_a_500(redis: Redis) -> None:
    # an error reply to the handshake (here SELECT of a database Redis doesn't have; a Redis
    # without HELLO alike): the API must answer 503 (unavailable), not an internal error
    failure = ping_failure(kwargs_of(redis, db=99_999))
    assert isinstance(failure, RedisConnectionError), repr(failure)
    assert "refused the handshake" in str(failure)


def test_an_unreachable_redis_is_a_connection_error_and_the_next_call_tries_again() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens here once closed

    async def scenario() -> tuple[BaseException | None, int]:
        conns = Connections({"host": "127.0.0.1", "port": port})
        failures = []
        for _ in range(2):
            try:
                await conns.call("PING")
            except Exception as exc:  # noqa: BLE001 - what it failed with
                failures.append(exc)
        opened = conns.opened
        await conns.aclose()
        return failures[0] if len(failures) == 2 else None, opened

    failure, opened = run(scenario())
    assert isinstance(failure, RedisConnectionError)
    assert opened == 2  # the failed one was dropped, not reused


def test_a_reply_slower_than_the_socket_timeout_fails_and_drops_the_connection(
    redis: Redis,
) -> None:
    async def scenario() -> tuple[BaseException | None, float, Any, int]:
        conns = Connections(kwargs_of(redis, socket_timeout=0.3))
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await conns.call("BLPOP", "t:wire:never", 5)
            failure = None
        except Exception as exc:  # noqa: BLE001 - what it failed with
            failure = exc
        took = loop.time() - started
        after = await conns.call("PING")  # a new connection: the timed-out one is gone
        opened = conns.opened
        await conns.aclose()
        return failure, took, after, opened

    failure, took, after, opened = run(scenario())
    assert isinstance(failure, RedisTimeoutError)
    assert 0.25 < took < 3
    assert after == "PONG" and opened == 2


def test_a_slow_reply_within_the_timeout_is_not_cut(redis: Redis) -> None:
    async def scenario() -> Any:
        conns = Connections(kwargs_of(redis, socket_timeout=2.0))
        reply = await conns.call("BLPOP", "t:wire:empty", 0.3)
        await conns.aclose()
        return reply

    assert run(scenario()) is None


def _kill(redis: Redis, name: str) -> None:
    (mine,) = [c for c in redis.client_list() if c["name"] == name]
    redis.client_kill_filter(_id=mine["id"])


def test_a_connection_the_server_drops_mid_call_fails_that_call(redis: Redis) -> None:
    async def scenario() -> BaseException | None:
        conns = Connections(kwargs_of(redis, client_name="hot-wire-kill"))
        call = asyncio.ensure_future(conns.call("BLPOP", "t:wire:killed", 5))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not any(
            c["name"] == "hot-wire-kill" and c["cmd"] == "blpop" for c in redis.client_list()
        ):
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        _kill(redis, "hot-wire-kill")
        try:
            await asyncio.wait_for(call, 3)
            failure = None
        except Exception as exc:  # noqa: BLE001 - what it failed with
            failure = exc
        await conns.aclose()
        return failure

    assert isinstance(run(scenario()), RedisConnectionError)


def test_a_connection_dropped_while_idle_is_not_used_again(redis: Redis) -> None:
    async def scenario() -> tuple[Any, int]:
        conns = Connections(kwargs_of(redis, client_name="hot-wire-idle"))
        await conns.call("PING")
        _kill(redis, "hot-wire-idle")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while conns.connected:  # the loop hears the close
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        again = await conns.call("PING")
        opened = conns.opened
        await conns.aclose()
        return again, opened

    assert run(scenario()) == ("PONG", 2)


def test_callers_cancelled_mid_batch_leave_every_other_reply_to_its_own_caller(
    redis: Redis,
) -> None:
    # a cancelled caller's reply is still read off the connection, and dropped: the replies
    # after it must not shift onto the next callers (that would hand one decision another's)
    async def scenario() -> tuple[dict[int, Any], list[Any], int]:
        conns = Connections(kwargs_of(redis), max_connections=2)
        tasks = {i: asyncio.ensure_future(conns.call("ECHO", f"reply-{i}")) for i in range(300)}
        await asyncio.sleep(0)  # the batch is packed and written; now cancel a third of them
        for i in range(0, 300, 3):
            tasks[i].cancel()
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        done = dict(zip(tasks, results, strict=True))
        after = [await conns.call("ECHO", f"after-{i}") for i in range(5)]
        opened = conns.opened
        await conns.aclose()
        return done, after, opened

    done, after, opened = run(scenario())
    for i, result in done.items():
        if i % 3 == 0:
            assert isinstance(result, asyncio.CancelledError) or result == f"reply-{i}"
        else:
            assert result == f"reply-{i}", (i, result)
    assert any(isinstance(r, asyncio.CancelledError) for r in done.values())  # mid-batch
    assert after == [f"after-{i}" for i in range(5)]
    assert opened <= 2
