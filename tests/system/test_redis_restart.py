"""Roles ride out a Redis restart: the background roles carry on working after Redis comes back,
and an API started while Redis is down waits for it and then serves."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from redis import Redis
from rq import Worker

from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis, free_port
from broker.runs.agents import register_agent
from broker.runs.starting import start_run, wait_run
from tests.support.api_process import api_env, spawn_api
from tests.support.proc import stop_process
from tests.support.waiting import wait_for

DROPPED = 6
"""Connections the stand-in drops before Redis comes back: an impatient client gives up
after two per command."""


def test_worker_and_sweeper_survive_a_redis_restart(tmp_path: Path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env["APPROVAL_BROKER_REDIS_URL"] = server.url
    roles = [
        subprocess.Popen(
            [sys.executable, "-m", "approval_broker", role],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for role in ("worker", "sweeper")
    ]
    try:
        broker = Broker(Redis.from_url(server.url))
        register_agent(broker, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
        wait_for(lambda: len(Worker.all(connection=broker.redis)) >= 1, timeout=30)
        broker.redis.close()

        server.kill()
        server.start()

        broker = Broker(Redis.from_url(server.url))
        run = start_run(broker, "refunds", "Refund $120 on order A103 because the floor is torn.")
        waiting = wait_run(broker, run.id, timeout=60, until=(RunStatus.waiting, RunStatus.failed))
        assert waiting.status is RunStatus.waiting, waiting.error
        assert [p.poll() for p in roles] == [None, None], "a role died with Redis"
        broker.redis.close()
    finally:
        for p in roles:
            p.terminate()
        exits = []
        for p in roles:
            try:
                exits.append(p.wait(timeout=30))
            except subprocess.TimeoutExpired:
                p.kill()
                exits.append(p.wait())
        server.close()
    assert exits == [0, 0], "a role did not stop cleanly on SIGTERM after the restart"


def test_an_api_started_while_redis_is_down_waits_for_it_and_serves(tmp_path: Path):
    """`approval-broker api` started while Redis restarts (here: a stand-in on Redis's port
    that drops every connection) keeps trying at start, as the other roles do, and serves
    once Redis is back, rather than exit with a Redis error."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    server.kill()
    port = free_port()
    api = spawn_api(api_env(server.url, tmp_path), port)
    try:
        with socket.create_server(("127.0.0.1", server.port)) as stand_in:
            stand_in.settimeout(0.5)
            dropped = 0
            while dropped < DROPPED and api.poll() is None:  # more than an impatient start tries
                try:
                    conn, _ = stand_in.accept()
                except TimeoutError:
                    continue
                conn.close()
                dropped += 1
        assert api.poll() is None, api.stdout.read() if api.stdout else ""
        server.start()
        health = f"http://127.0.0.1:{port}/healthz"

        def healthy() -> bool:
            try:
                return httpx.get(health, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=90)
        assert api.poll() is None
    finally:
        stop_process(api, grace_s=30)
        server.close()
