"""A long-poll on a run reads the run once before it waits: the stream reader's positions are
fixed first, so the one read both answers a settled run and is where the wait starts (`api.runs`).
The module has a Redis of its own: Redis counts commands server-wide."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from redis import Redis

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import parse_config
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import start_run
from tests.support.counted_redis import redis_server  # noqa: F401 - counts need a Redis of their own
from tests.support.waiting import wait_for

STARTER = "tok-starter-long-poll-reads-0123"
HEADERS = {"Authorization": f"Bearer {STARTER}"}


def calls(redis: Redis, command: str) -> int:
    return int(redis.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def run_reads(redis: Redis) -> int:
    """Reads of a run's pending set so far (every read of a run takes one, `run_read`)."""
    return calls(redis, "smembers")


def app_on(redis: Redis) -> tuple[FastAPI, str]:
    """An API on `redis` with the demo agent, and a run of it that no worker takes."""
    cfg = parse_config(
        {
            "queues": {"default": {"channels": ["inbox"]}},
            "approvers": {"svc": {"token_sha256": hash_token(STARTER), "roles": ["requester"]}},
        }
    )
    broker = Broker(redis, cfg, prefix="t:")
    register_agent(broker, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
    queued = start_run(broker, "refunds", "refund order A1", started_by="svc")  # no worker
    return create_app(
        Settings(admin_token="tok-admin-long-poll-reads-0123"), cfg, broker
    ), queued.id


def test_a_long_poll_on_a_run_reads_it_once_before_it_waits_and_once_when_the_wait_is_up(
    redis: Redis,
) -> None:
    app, run_id = app_on(redis)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        before = run_reads(redis)
        resp = http.get(f"/v1/runs/{run_id}", params={"wait": 0.3}, headers=HEADERS)
        after = run_reads(redis)
    assert resp.status_code == 200 and resp.json()["status"] == "queued"
    # nothing happened: read where the wait starts and when it is up (the run as it stands
    # then); a read before the reader's positions were fixed would be a third
    assert after - before == 2


def test_a_long_poll_that_follows_another_reads_on_from_the_stream_readers_positions(
    redis: Redis,
) -> None:
    """The first long-poll looks up the newest ids of the streams it follows (its reader's
    positions); one soon after, once that reader stopped (its last read answered, nobody
    listening), reads on from where it stood: no look-up."""
    app, run_id = app_on(redis)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        looked_up = calls(redis, "xrevrange")
        first = http.get(f"/v1/runs/{run_id}", params={"wait": 0.2}, headers=HEADERS)
        after_first = calls(redis, "xrevrange")
        wait_for(lambda: app.state.waiter._task.done())  # its blocked read came back
        second = http.get(f"/v1/runs/{run_id}", params={"wait": 0.2}, headers=HEADERS)
        after_second = calls(redis, "xrevrange")
    assert first.status_code == second.status_code == 200
    assert after_first - looked_up == 2  # the queue's stream and the run-events stream
    assert after_second == after_first
