"""Background roles ride out a Redis restart: after Redis comes back they carry on working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from redis import Redis
from rq import Worker

from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.redis.embedded import EmbeddedRedis
from broker.runs.agents import register_agent
from broker.runs.starting import start_run, wait_run
from tests.support.waiting import wait_for


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
