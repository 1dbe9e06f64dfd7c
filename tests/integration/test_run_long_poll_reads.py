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

STARTER = "tok-starter-long-poll-reads-0123"


def run_reads(redis: Redis) -> int:
    """Reads of a run's pending set so far (every read of a run takes one, `run_read`)."""
    return int(redis.info("commandstats").get("cmdstat_smembers", {}).get("calls", 0))


def test_a_long_poll_on_a_run_reads_it_once_before_it_waits_and_once_when_the_wait_is_up(
    redis: Redis,
) -> None:
    cfg = parse_config(
        {
            "queues": {"default": {"channels": ["inbox"]}},
            "approvers": {"svc": {"token_sha256": hash_token(STARTER), "roles": ["requester"]}},
        }
    )
    broker = Broker(redis, cfg, prefix="t:")
    register_agent(broker, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
    queued = start_run(broker, "refunds", "refund order A1", started_by="svc")  # no worker
    app: FastAPI = create_app(Settings(admin_token="tok-admin-long-poll-reads-0123"), cfg, broker)
    headers = {"Authorization": f"Bearer {STARTER}"}
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        before = run_reads(redis)
        resp = http.get(f"/v1/runs/{queued.id}", params={"wait": 0.3}, headers=headers)
        after = run_reads(redis)
    assert resp.status_code == 200 and resp.json()["status"] == "queued"
    # nothing happened: read where the wait starts and when it is up (the run as it stands
    # then); a read before the reader's positions were fixed would be a third
    assert after - before == 2
