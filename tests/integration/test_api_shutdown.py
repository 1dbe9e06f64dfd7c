"""The API's own Redis connections end with it.

The stream reader of long-polls (`api.follow.Waiter`) and its redis.asyncio client are the
API's, not the broker's: its shutdown closes them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from redis import Redis
from redis import asyncio as aredis

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person

TOKEN = "tok-hot-shutdown"


API_CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "approvers": {"alice": person(TOKEN, ["finance"])},
}


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
    assert id(waiter.reads.client) in closed  # the reader's own client, closed by the lifespan
    assert waiter._task is None
    assert until(lambda: not (clients_by(redis, "xread") - before)), "still connected"
