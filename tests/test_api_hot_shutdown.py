"""The API's own Redis connections end with it, and the hot path's are capped under bursts.

The stream reader of long-polls (`api.follow.Waiter`) and the hot path's redis.asyncio
connections (`broker.deciding_async.Connections`) are the API's, not the broker's: its
shutdown closes them, idle or busy. A burst of decisions on a slow Redis waits for one of a
bounded number of connections instead of opening one per loop iteration.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from redis import Redis
from redis import asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError

from api.app import create_app
from api.testing import ServerThread
from broker.auth import hash_token
from broker.client import Broker
from broker.config import Config, Settings, parse_config
from broker.deciding_async import Connections
from broker.models import NewRequest

TOKEN = "tok-hot-shutdown"


@pytest.fixture
def cfg() -> Config:
    return parse_config(
        {
            "queues": {"default": {"channels": ["inbox"]}},
            "approvers": {"alice": {"token_sha256": hash_token(TOKEN), "roles": ["finance"]}},
        }
    )


def clients_by(redis: Redis, cmd: str) -> set[str]:
    return {c["id"] for c in redis.client_list() if c.get("cmd") == cmd}


def until(check: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_the_stream_reader_and_its_client_are_closed_at_shutdown(
    api_broker: Broker, cfg: Config, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[int] = []
    real_aclose = aredis.Redis.aclose

    async def spying(self: aredis.Redis, *args: Any, **kwargs: Any) -> None:
        closed.append(id(self))
        await real_aclose(self, *args, **kwargs)

    monkeypatch.setattr(aredis.Redis, "aclose", spying)
    pending = api_broker.create_request(NewRequest(tool_name="refund", args={}))
    app = create_app(Settings(), cfg, api_broker)
    before = clients_by(redis, "xread")
    with ServerThread(app) as server:
        waiting = threading.Thread(
            target=lambda: httpx.get(
                f"{server.url}/v1/requests/{pending.id}?wait=30",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=30,
            ),
            daemon=True,
        )
        waiting.start()
        assert until(lambda: clients_by(redis, "xread") - before), "no stream reader started"
        waiter = app.state.waiter
    waiting.join(10)
    assert id(waiter.redis) in closed  # the reader's own client, closed by the lifespan
    assert waiter._task is None
    assert until(lambda: not (clients_by(redis, "xread") - before)), "still connected"


def test_hot_connections_are_closed_at_shutdown(api_broker: Broker, cfg: Config) -> None:
    app = create_app(Settings(), cfg, api_broker)
    req = api_broker.create_request(NewRequest(tool_name="refund", args={}))
    with ServerThread(app) as server:
        resp = httpx.post(
            f"{server.url}/v1/requests/{req.id}/decision",
            json={"outcome": "approved"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert resp.status_code == 200 and resp.json()["status"] == "approved"
        hot = app.state.hot._redis
        assert hot is not None and hot.opened == 1  # the decision went through the hot path
    assert hot.connected == 0


def _connections(redis: Redis, cap: int) -> Connections:
    given = redis.connection_pool.connection_kwargs
    kwargs = {k: given[k] for k in ("host", "port", "password") if given.get(k) is not None}
    return Connections(kwargs, max_connections=cap)


def test_a_busy_connection_is_closed_by_aclose(redis: Redis) -> None:
    async def scenario() -> tuple[int, BaseException | None]:
        conns = _connections(redis, 4)
        held = asyncio.ensure_future(conns.call("BLPOP", "t:never", 5))  # holds its connection
        deadline = time.monotonic() + 5
        while conns.opened == 0 or conns.connected == 0:
            assert time.monotonic() < deadline, (conns.opened, conns.connected, held)
            await asyncio.sleep(0.01)
        await conns.aclose()
        try:
            await asyncio.wait_for(held, 2)  # ends at once, not after BLPOP's 5 s
            failure = None
        except (asyncio.CancelledError, Exception) as exc:  # noqa: BLE001 - what it ended with
            failure = exc
        return conns.connected, failure

    connected, failure = asyncio.run(scenario())
    assert connected == 0
    assert isinstance(failure, RedisConnectionError)  # redis's own: the API answers it 503


def test_a_call_queued_but_not_sent_fails_at_aclose_and_never_reaches_redis(redis: Redis) -> None:
    async def scenario() -> BaseException | None:
        conns = _connections(redis, 4)
        queued = asyncio.ensure_future(conns.call("SET", "t:after-close", "1"))
        await asyncio.sleep(0)  # the call is queued and its flush scheduled, not yet run
        assert not queued.done()
        await conns.aclose()
        try:
            await asyncio.wait_for(queued, 2)
        except (asyncio.CancelledError, Exception) as exc:  # noqa: BLE001 - what it ended with
            return exc
        return None

    failure = asyncio.run(scenario())
    assert isinstance(failure, RedisConnectionError)
    assert redis.get("t:after-close") is None


def test_a_burst_waits_for_a_capped_number_of_connections(redis: Redis) -> None:
    async def scenario() -> tuple[int, list[Any]]:
        conns = _connections(redis, 2)
        calls = []
        for i in range(6):  # six loop iterations: six batches, each holding a connection
            calls.append(asyncio.ensure_future(conns.call("BLPOP", f"t:empty:{i}", 0.2)))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        replies = await asyncio.wait_for(asyncio.gather(*calls), 10)
        opened = conns.opened
        await conns.aclose()
        return opened, replies

    opened, replies = asyncio.run(scenario())
    assert opened == 2
    assert replies == [None] * 6  # every call was answered: the excess waited its turn
