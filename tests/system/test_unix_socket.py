"""The embedded Redis on a Unix socket: as private as its TCP port, and every role works over it.

Issue 18: every process of a one-machine fleet talked to Redis over loopback TCP. The embedded
Redis now also listens on `redis.sock` in its data directory (0600, the same password), and
`up`, the roles that join it and the ops commands use that socket; `redis.url` keeps the TCP
URL for anything that can't.
"""

from __future__ import annotations

import base64
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from approval_broker_client import RemoteBroker
from redis import Redis
from redis.connection import UnixDomainSocketConnection
from refunds_demo import AGENT_NAME, register_demo

from approval_broker.up import banner
from broker.domain.config import load_config
from broker.domain.models import NewRequest, RunStatus, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.embedded import (
    MAX_SOCKET_PATH,
    SOCKET_FILE,
    UNIX_URL_FILE,
    URL_FILE,
    EmbeddedRedis,
    free_port,
    redact,
    running_local_url,
    running_url,
    running_urls,
)
from broker.runs.starting import run_queue
from tests.support.fakes.deciding_receiver import DecidingReceiver, mix_policy
from tests.support.fleet_processes import Fleet
from tests.support.up import healthy, start_up, stop_up
from tests.support.waiting import wait_for

ADMIN = "ab_test-admin-token-for-unix-sockets"
SECRET = "whsec_" + base64.b64encode(b"unix-socket-test-secret-0123456").decode()
ENDPOINT = "bot"


def raw_unix(path: Path, *words: str) -> bytes:
    """One RESP command on a fresh, never-authenticated connection to the socket; the reply."""
    request = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(request.encode())
        return s.recv(4096)


def clients(redis: Redis) -> list[str]:
    """The address of every client connected to the server (a Unix one reads `/path:0`)."""
    return [c["addr"] for c in redis.client_list()]


def on_socket(addr: str, path: Path | None) -> bool:
    """`addr` (CLIENT LIST's, which Redis cuts at 46 characters) is a client of `path`."""
    return addr.startswith("/") and str(path).startswith(addr.removesuffix(":0"))


# ---- the server -----------------------------------------------------------------------------


def test_the_socket_wants_the_password_and_only_its_owner_may_open_it(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    with EmbeddedRedis(data) as server:
        sock = data / SOCKET_FILE
        assert server.socket_path == sock.absolute()
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        assert stat.S_IMODE(sock.lstat().st_mode) == 0o600
        assert raw_unix(sock, "PING").startswith(b"-NOAUTH")
        assert raw_unix(sock, "AUTH", "wrong").startswith(b"-WRONGPASS")
        assert raw_unix(sock, "AUTH", server.password) == b"+OK\r\n"
        assert server.unix_url == f"unix://:{server.password}@{sock.absolute()}?db=0"
        over_unix = Redis.from_url(server.unix_url_for(4))
        assert over_unix.connection_pool.connection_class is UnixDomainSocketConnection
        over_unix.set("k", "v")
        assert Redis.from_url(server.url_for(4)).get("k") == b"v"  # one server, both ways
        assert redact(server.unix_url) == f"unix://:***@{sock.absolute()}?db=0"
        over_unix.close()


def test_each_url_file_names_its_way_in_and_both_go_when_the_server_stops(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    with EmbeddedRedis(data) as server:
        assert (data / URL_FILE).read_text() == server.url  # unchanged: the TCP URL
        assert (data / UNIX_URL_FILE).read_text() == server.unix_url
        assert stat.S_IMODE((data / UNIX_URL_FILE).stat().st_mode) == 0o600
        assert running_url(data) == server.url
        assert running_local_url(data) == server.unix_url == server.local_url
        assert running_urls(data) == (server.url, server.unix_url)
    assert not (data / URL_FILE).exists() and not (data / UNIX_URL_FILE).exists()
    assert not (data / SOCKET_FILE).exists()
    assert running_local_url(data) is None and running_urls(data) == ()


def test_a_data_dir_too_long_for_a_socket_path_gets_tcp_only(tmp_path: Path) -> None:
    data = tmp_path / ("d" * max(1, MAX_SOCKET_PATH - len(str(tmp_path)))) / "redis"
    assert len(str(data / SOCKET_FILE)) > MAX_SOCKET_PATH
    with EmbeddedRedis(data) as server:
        assert server.socket_path is None and server.unix_url is None
        assert server.local_url == server.url == running_local_url(data)
        assert not (data / SOCKET_FILE).exists() and not (data / UNIX_URL_FILE).exists()
        assert Redis.from_url(server.local_url).ping()


def test_a_socket_path_with_a_space_and_a_percent_sign_is_quoted_in_its_url(
    tmp_path: Path,
) -> None:
    data = tmp_path / "A S 1%" / "redis"
    with EmbeddedRedis(data) as server:
        assert server.unix_url and "/A%20S%201%25/redis/" in server.unix_url
        client = Redis.from_url(server.unix_url)
        assert client.connection_pool.connection_kwargs["path"] == str(data / SOCKET_FILE)
        assert client.ping()
        client.close()


def test_a_restart_after_a_crash_listens_on_the_socket_again(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        assert server.unix_url is not None
        client = Redis.from_url(server.unix_url)
        client.set("kept", "1")
        server.kill()  # the socket file is left behind, as after a crash
        assert (tmp_path / "redis" / SOCKET_FILE).exists()
        server.start()
        assert Redis.from_url(server.unix_url).get("kept") == b"1"
    finally:
        server.close()


def test_the_session_server_takes_a_database_over_its_socket(redis_unix_url: str) -> None:
    client = Redis.from_url(redis_unix_url)
    assert client.connection_pool.connection_class is UnixDomainSocketConnection
    assert client.dbsize() == 0  # flushed for this test
    client.close()


def test_the_banner_masks_both_urls() -> None:
    settings = Settings(redis_url="unix://:hunter2-password@/home/u/ab/redis/redis.sock?db=0")
    text = banner(settings, "t", False, [], tcp_url="redis://:hunter2-password@127.0.0.1:6390/0")
    assert "hunter2" not in text
    assert "  Redis        unix://:***@/home/u/ab/redis/redis.sock?db=0" in text
    assert "  Redis (TCP)  redis://:***@127.0.0.1:6390/0" in text


# ---- every role over the socket ---------------------------------------------------------------


@pytest.fixture
def socket_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis").start()
    assert server.unix_url is not None
    yield server
    server.close()


def test_a_full_cycle_with_every_process_on_the_unix_socket(
    socket_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """A run started over HTTP (approval_broker_client) is run by an RQ worker, its request delivered to a
    webhook by the notifier, approved by a signed reply to the API, resumed by the resumer and
    finished by the worker; a request nobody answers is timed out by the sweeper and seen by a
    long-poll (the API's stream reader). Every client the server has is a Unix one."""
    unix_url = socket_redis.unix_url
    assert unix_url is not None
    api_port = free_port()
    api = f"http://127.0.0.1:{api_port}"
    receiver = DecidingReceiver(
        SECRET, [api], endpoint=ENDPOINT, policy=mix_policy({"approve": 1}), threads=2
    ).start()
    config_path = tmp_path / "fleet.toml"
    config_path.write_text(
        f"""
[queues.default]
channels = ["webhook:{ENDPOINT}"]
[queues.quick]
channels = ["inbox"]
timeout_s = 1

[webhooks.{ENDPOINT}]
url = "{receiver.url("/hook")}"
secret = "{SECRET}"
roles = ["ops"]
backoff_s = 0.05
"""
    )
    redis = Redis.from_url(unix_url)
    broker = Broker(redis, load_config(config_path))
    register_demo(broker)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env |= {
        "APPROVAL_BROKER_REDIS_URL": unix_url,
        "APPROVAL_BROKER_CONFIG": str(config_path),
        "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN,
        "APPROVAL_BROKER_DATA_DIR": str(tmp_path / "data"),
        "APPROVAL_BROKER_NOTIFIER_BLOCK_MS": "100",
        "PYTHONUNBUFFERED": "1",
    }
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Fleet(env, logs, [api_port])
    one_each = ("api-1", "notifier-1", "worker-1", "sweeper-1", "resumer-1")
    fleet.members = [m for m in fleet.members if m.name in one_each]
    try:
        fleet.start()
        with RemoteBroker(api, ADMIN) as remote:
            prompt = "Refund $80 on order A103 because the tent floor tore."
            run_id = remote.start_run(AGENT_NAME, prompt)
            quick = remote.create_request(NewRequest(tool_name="t", queue="quick"))
            [timed_out] = remote.wait_for([quick.id], 30)
            assert timed_out.status == Status.timed_out  # the client's own Status, by value
            wait_for(lambda: remote.get_run(run_id).status == RunStatus.finished, timeout=60)
            run = remote.get_run(run_id)
        assert run.output and run.output["refunded"] is True, run
        [request] = broker.get_requests(list(receiver.answered))
        assert request.status is Status.approved
        assert request.decision and request.decision.decided_by == f"webhook:{ENDPOINT}/fleet-bot"
        assert run_queue(broker).count == 0
        addrs = clients(redis)
        assert len(addrs) >= 5  # api (sync + hot path + stream reader), notifier, worker, ...
        assert all(on_socket(a, socket_redis.socket_path) for a in addrs), addrs
    finally:
        fleet.stop()
        receiver.stop()
        redis.close()
    for member in fleet.members:
        assert "Traceback" not in member.log.read_text(), member.tail(30)


def test_roles_and_commands_without_a_url_join_up_over_the_socket(
    socket_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """What `up` runs (the embedded Redis in the data dir) is joined over its socket, and a role
    with email configured finds the shared link secret there as before."""
    data = tmp_path  # socket_redis lives in tmp_path / "redis", as `up --data-dir tmp_path` puts it
    config = tmp_path / "approval-broker.toml"
    config.write_text(
        '[queues.default]\nchannels = ["email:leads"]\n[email.lists.leads]\nto = ["a@example.com"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env |= {"APPROVAL_BROKER_CONFIG": str(config), "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN}
    assert socket_redis.unix_url is not None
    broker = Broker(Redis.from_url(socket_redis.unix_url), load_config(config))
    broker.create_request(NewRequest(tool_name="over-the-socket"))
    pending = subprocess.run(
        [sys.executable, "-m", "approval_broker", "pending", "--json", "--data-dir", str(data)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pending.returncode == 0, pending.stderr
    assert "over-the-socket" in pending.stdout
    port = free_port()
    api = subprocess.Popen(
        [sys.executable, "-m", "approval_broker", "api", "--port", str(port), "--data-dir", data],
        env=env | {"PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def healthy() -> bool:
            assert api.poll() is None, api.stdout.read() if api.stdout else ""
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=60, interval=0.1)
        addrs = clients(broker.redis)  # this test's own client and the api's
        assert len(addrs) >= 2
        assert all(on_socket(a, socket_redis.socket_path) for a in addrs), addrs
    finally:
        api.terminate()
        api.wait(30)
    assert (tmp_path / "redis" / "link.secret").exists()  # the api took the shared secret


def test_up_hands_its_roles_the_socket_and_shows_both_urls_masked(tmp_path: Path) -> None:
    proc, url = start_up(tmp_path)
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        data = tmp_path / "redis"
        unix_url = running_local_url(data)
        assert unix_url and unix_url.startswith("unix://") and running_url(data) != unix_url
        redis = Redis.from_url(unix_url)
        # api (sync, hot path), worker, notifier, sweeper and `up` itself, all on the socket
        wait_for(lambda: len(clients(redis)) >= 6, timeout=30)
        addrs = clients(redis)
        assert all(on_socket(a, data / SOCKET_FILE) for a in addrs), addrs
        redis.close()
    finally:
        out = stop_up(proc) if proc.poll() is None else ""
    assert proc.returncode == 0, out
    password = (tmp_path / "redis" / "redis.password").read_text().strip()
    assert password not in out
    assert f"  Redis        unix://:***@{data / SOCKET_FILE}?db=0" in out
    assert "  Redis (TCP)  redis://:***@127.0.0.1:" in out


def test_a_server_started_without_a_socket_drops_a_crashed_runs_socket_url(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    with EmbeddedRedis(data) as crashed:
        stale = crashed.unix_url
    assert stale is not None
    (data / UNIX_URL_FILE).write_text(stale)  # what a run that crashed leaves behind
    with EmbeddedRedis(data, unix_socket=False) as server:
        assert not (data / UNIX_URL_FILE).exists()
        assert running_local_url(data) == server.url
