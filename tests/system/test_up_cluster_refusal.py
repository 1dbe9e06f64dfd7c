"""`approval-broker up` pointed at a Redis Cluster refuses in one line, before starting anything.

`up` runs the whole fleet on one Redis; a cluster's roles are started one by one (docs). A
one-node cluster (all slots on one master) is enough to be one: `INFO cluster` says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from approval_broker.up import ONE_REDIS
from broker.redis.embedded import free_port
from broker.redis.local_cluster import LocalCluster
from tests.support.api_process import ADMIN, START_TIMEOUT_S


@pytest.fixture
def one_node_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "cluster", masters=1, replicas_per_master=0)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


def run_up(env: dict[str, str], data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "approval_broker", "up", "--port", str(free_port()),
         "--data-dir", str(data_dir)],
        env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S,
    )  # fmt: skip


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    return env | {"APPROVAL_BROKER_ADMIN_TOKEN": ADMIN, "PYTHONUNBUFFERED": "1"}


def test_up_on_a_cluster_url_refuses_in_one_line(
    one_node_cluster: LocalCluster, tmp_path: Path
) -> None:
    env = base_env() | {"APPROVAL_BROKER_REDIS_URL": one_node_cluster.url}
    done = run_up(env, tmp_path / "data")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {ONE_REDIS}"], done.stderr
    assert "starting" not in done.stdout, done.stdout  # no role was started
    assert "runs on one Redis; for a cluster start the roles (api, worker" in ONE_REDIS


def test_up_with_the_cluster_setting_refuses_in_one_line(redis_url: str, tmp_path: Path) -> None:
    env = base_env() | {
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_REDIS_CLUSTER": "1",
    }
    done = run_up(env, tmp_path / "data")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {ONE_REDIS}"], done.stderr
