"""deploy/compose.cluster.yaml: six AOF nodes, an init service that really forms a cluster, and
every broker role clustered with RQ on its own single Redis.

Docker is not available to the test run, so the init service's script is run here as it is
written in the file, against six empty cluster-enabled nodes, with this machine's redis-cli.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from broker.redis_cluster import LocalCluster
from broker.redis_server import find_redis_server

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
ROLES = ("api", "worker", "notifier", "sweeper")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.cluster.yaml").read_text())


def interpolated(value: str) -> str:
    """`value` with every `${NAME:?message}` replaced by a dummy, as compose fills them in."""
    return re.sub(r"\$\{(\w+)(:\?[^}]*)?\}", lambda m: f"dummy-{m[1].lower()}", value)


def nodes(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if n.startswith("redis-node-")}


def test_six_cluster_nodes_each_with_aof_on_its_own_volume(compose: dict[str, Any]) -> None:
    found = nodes(compose)
    assert len(found) == 6
    volumes = set()
    for name, service in found.items():
        command = service["command"]
        assert command[command.index("--cluster-enabled") + 1] == "yes", name
        assert command[command.index("--appendonly") + 1] == "yes", name
        assert (
            command[command.index("--requirepass") + 1]
            == command[command.index("--masterauth") + 1]
        )
        (volume,) = service["volumes"]
        assert volume.endswith(":/data")
        volumes.add(volume.split(":")[0])
    assert len(volumes) == 6 and volumes <= set(compose["volumes"])


def test_every_role_is_clustered_with_rq_on_a_single_redis(compose: dict[str, Any]) -> None:
    services = compose["services"]
    rq = services["rq-redis"]
    assert "--cluster-enabled" not in rq["command"]
    for role in ROLES:
        service = services[role]
        env = service["environment"]
        assert env["APPROVAL_BROKER_REDIS_CLUSTER"] == "1", role
        assert urlsplit(interpolated(env["APPROVAL_BROKER_REDIS_URL"])).hostname in nodes(
            compose
        ), role
        assert urlsplit(env["APPROVAL_BROKER_RQ_REDIS_URL"]).hostname == "rq-redis", role
        after = service["depends_on"]
        assert after["cluster-init"]["condition"] == "service_completed_successfully", role
        assert after["rq-redis"]["condition"] == "service_healthy", role
    init = services["cluster-init"]
    assert set(init["depends_on"]) == set(nodes(compose))
    assert init["environment"]["NODES"].split() == [f"{n}:6379" for n in sorted(nodes(compose))]


def run_init(compose: dict[str, Any], cluster: LocalCluster) -> subprocess.CompletedProcess[str]:
    """The init service's script as compose would run it (`$$` is a literal `$`), on `cluster`."""
    init = compose["services"]["cluster-init"]
    assert init["entrypoint"] == ["sh", "-c"]
    script = init["command"][0].replace("$$", "$")
    bin_dir = str(Path(find_redis_server()).parent)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "REDISCLI_AUTH": cluster.password,
        "NODES": " ".join(f"127.0.0.1:{node.port}" for node in cluster.nodes),
    }
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("getent") is None, reason="the init script resolves with getent")
def test_the_init_service_forms_the_cluster_once(compose: dict[str, Any], tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, masters=3).start(form=False)
    try:
        assert not cluster.ready()
        first = run_init(compose, cluster)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "cluster formed" in first.stdout
        cluster.wait_ready()
        masters = cluster.masters()
        assert len(masters) == 3
        assert all(len(cluster.replicas_of(m)) == 1 for m in masters)
        again = run_init(compose, cluster)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already formed" in again.stdout
    finally:
        cluster.close()
