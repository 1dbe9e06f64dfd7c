"""The fsync policy reaches the Redis that runs, and a Redis that keeps less is named (Guarantee 4).

A role without APPROVAL_BROKER_REDIS_URL starts its embedded Redis with `[broker] redis_fsync`
(default `always`), read back from the running server. A Redis of the operator's own can't be
set by the broker: a role at start and `approval-broker status` read its AOF state and
`appendfsync` and warn when it keeps less than the chosen policy, and say nothing of
`appendfsync` to a user whose ACL refuses `CONFIG GET`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.redis.embedded import EmbeddedRedis, running_url
from tests.support.acl_user import readme_user
from tests.support.waiting import wait_for

runner = CliRunner()
EVERYSEC_WARNING = "warning: Redis runs appendfsync everysec: a crash can lose"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    return env | extra


@pytest.fixture
def sweeper(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Path]]:
    """Start `approval-broker sweeper` with an environment; its stderr goes to a file."""
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str]) -> Path:
        log = tmp_path / f"sweeper-{len(started)}.err"
        with log.open("wb") as sink:
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "approval_broker", "sweeper"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=sink,
                )
            )
        return log

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("config", "expected"), [("", "always"), ('[broker]\nredis_fsync = "everysec"\n', "everysec")]
)
def test_a_roles_embedded_redis_runs_the_configured_fsync(
    tmp_path: Path, sweeper: Callable[[dict[str, str]], Path], config: str, expected: str
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(config)
    data = tmp_path / "data"
    sweeper(clean_env(APPROVAL_BROKER_DATA_DIR=str(data), APPROVAL_BROKER_CONFIG=str(path)))
    url = wait_for(lambda: running_url(data / "redis"), timeout=60)
    client = Redis.from_url(url)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": expected}
    finally:
        client.close()


def test_a_role_on_a_redis_of_its_own_warns_when_it_fsyncs_every_second(
    tmp_path: Path, sweeper: Callable[[dict[str, str]], Path]
) -> None:
    with EmbeddedRedis(tmp_path / "redis", fsync="everysec") as server:
        log = sweeper(clean_env(APPROVAL_BROKER_REDIS_URL=server.url))
        wait_for(lambda: EVERYSEC_WARNING in log.read_text(), timeout=60)
        assert 'redis_fsync = "everysec"' in log.read_text()  # how to say it is meant


def status(
    monkeypatch: pytest.MonkeyPatch, folder: Path, url: str, config: str = ""
) -> tuple[str, dict[str, Any]]:
    """`approval-broker status` on `url` with `config`: its text, and its JSON's `redis`."""
    path = folder / "status.toml"
    path.write_text(config)
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_URL", url)
    monkeypatch.setenv("APPROVAL_BROKER_CONFIG", str(path))
    monkeypatch.delenv("APPROVAL_BROKER_REDIS_FSYNC", raising=False)
    text, as_json = runner.invoke(app, ["status"]), runner.invoke(app, ["status", "--json"])
    assert text.exit_code == as_json.exit_code == 0, text.output + as_json.output
    return text.stdout, json.loads(as_json.stdout)["redis"]


def test_status_warns_about_a_redis_that_keeps_less_than_the_chosen_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EmbeddedRedis(tmp_path / "redis", fsync="everysec") as server:
        text, report = status(monkeypatch, tmp_path, server.url)
        assert "redis durability: AOF on, appendfsync everysec" in text
        assert EVERYSEC_WARNING in text
        assert report["durability"] == {"aof": True, "appendfsync": "everysec"}

        text, report = status(
            monkeypatch, tmp_path, server.url, '[broker]\nredis_fsync = "everysec"\n'
        )
        assert "appendfsync everysec" in text and "warning" not in text  # the operator's choice
        assert report["durability_warning"] is None

        admin = Redis.from_url(server.url)
        admin.config_set("appendonly", "no")
        admin.close()
        text, report = status(
            monkeypatch, tmp_path, server.url, '[broker]\nredis_fsync = "everysec"\n'
        )
        assert "redis durability: AOF off" in text
        assert "warning: Redis runs without an AOF (appendonly no)" in text


def test_status_is_silent_on_appendfsync_when_the_acl_refuses_config_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with readme_user(tmp_path / "redis") as (_server, admin, user_url):
        admin.config_set("appendfsync", "everysec")  # would be warned about, if it could be read
        text, report = status(monkeypatch, tmp_path, user_url)
        assert report["durability"] == {"aof": True, "appendfsync": None}
        assert report["durability_warning"] is None
        assert "appendfsync unknown (CONFIG GET refused)" in text and "warning" not in text
