"""The embedded Redis is private to its user, and nothing in Redis can mint an email link.

Issue 12: a local user could read the embedded Redis (no password, 0644 AOF) and take the
link-signing key from it. Now Redis wants a password, its files are 0600 in a 0700 directory,
and the signing key lives outside Redis (config, environment, or a 0600 file of `up`'s).
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from itsdangerous import URLSafeTimedSerializer
from redis import Redis
from redis.exceptions import AuthenticationError, ResponseError

from broker.domain.config import parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.embedded import (
    PASSWORD_FILE,
    URL_FILE,
    EmbeddedRedis,
    free_port,
    private_secret,
    running_url,
)
from channels.email.config import email_section
from channels.email.links import (
    SECRET_ENV,
    SECRET_FILE,
    LinkError,
    prepare_link_secret,
    read_link,
    sign_link,
)
from tests.support.fakes.smtp import SmtpSink
from tests.support.waiting import wait_for

ADMIN = "ab_test-admin-token-for-redis-security"
SALT = "approval-broker.email-link:ab:"


def raw_command(port: int, *words: str) -> bytes:
    """Send one RESP command on a fresh connection that never authenticated; the first reply."""
    request = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request.encode())
        return s.recv(4096)


def modes(root: Path) -> dict[str, int]:
    """Permission bits of `root` and everything under it, by path relative to `root`."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def assert_private(root: Path) -> None:
    for name, mode in modes(root).items():
        is_dir = name == "." or (root / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), f"{name} is {oct(mode)}"


def every_value(redis: Redis) -> list[bytes]:
    """Every key name, field, member and value in the database, whatever its type."""
    found: list[bytes] = []
    for key in redis.scan_iter(count=1000):
        kind = redis.type(key).decode()
        if kind == "none":  # expired between SCAN and TYPE (RQ's markers live seconds)
            continue
        found.append(key)
        if kind == "string":
            found.append(redis.get(key) or b"")
        elif kind == "hash":
            for field, value in redis.hgetall(key).items():
                found += [field, value]
        elif kind == "list":
            found += redis.lrange(key, 0, -1)
        elif kind == "set":
            found += list(redis.smembers(key))
        elif kind == "zset":
            found += [m for m, _ in redis.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            for _, fields in redis.xrange(key):
                for field, value in fields.items():
                    found += [field, value]
        else:
            raise AssertionError(f"{key!r} has a type this test does not read: {kind}")
    return found


def forged_links(values: list[bytes], request_id: str, to: str, nonce: str) -> list[str]:
    """A link for every value in Redis used as the signing key, as the old code did."""
    claims = {"r": request_id, "to": to, "a": "approve", "n": nonce, "q": "default"}
    keys = {v.decode(errors="replace") for v in values if v}
    return [URLSafeTimedSerializer(k, salt=SALT).dumps(claims) for k in sorted(keys)]


# ---- the server ---------------------------------------------------------------------------


def test_a_client_without_the_password_cannot_read_the_embedded_redis(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "redis") as server:
        Redis.from_url(server.url).set("k", "v")
        assert raw_command(server.port, "GET", "k").startswith(b"-NOAUTH")
        assert raw_command(server.port, "AUTH", "wrong").startswith(b"-WRONGPASS")
        with pytest.raises((AuthenticationError, ResponseError)):
            Redis(port=server.port).get("k")
        assert Redis(port=server.port, password=server.password).get("k") == b"v"
        assert server.process is not None  # ps shows no password: it came on stdin
        cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert server.password.encode() not in cmdline


def test_the_password_survives_a_restart_so_connected_roles_keep_working(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        url = server.url
        server.kill()
        server.start()
        assert server.url == url and Redis.from_url(url).ping()
        assert (tmp_path / "redis" / PASSWORD_FILE).read_text().strip() == server.password
    finally:
        server.close()


def test_data_dir_is_0700_and_its_files_0600_even_if_they_were_loose(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    (data / "appendonly.aof").write_bytes(b"")  # an older version's AOF, 0644
    (data / "appendonly.aof").chmod(0o644)
    (data / "appendonlydir").mkdir(mode=0o755)  # Redis 7 keeps its AOF here
    (data / "appendonlydir").chmod(0o755)
    with EmbeddedRedis(data) as server:
        client = Redis.from_url(server.url)
        client.set("ab:k", "v" * 100)
        wait_for(lambda: (data / "appendonly.aof").stat().st_size > 0, timeout=5)
        assert {"redis.log", PASSWORD_FILE, URL_FILE} <= set(modes(data))
        assert_private(data)
        client.close()
    assert_private(data)


def test_racing_makers_of_a_secret_file_all_get_the_one_that_won(tmp_path: Path) -> None:
    path = tmp_path / "redis" / SECRET_FILE
    start = threading.Barrier(8)

    def make(_: int) -> str:
        start.wait()
        return private_secret(path)

    with ThreadPoolExecutor(8) as pool:
        made = set(pool.map(make, range(8)))
    assert made == {path.read_text().strip()} and len(made.pop()) == 64
    assert [p.name for p in path.parent.iterdir()] == [SECRET_FILE]  # no temporary file left
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# ---- the link secret ----------------------------------------------------------------------

EMAIL = {
    "queues": {"default": {"channels": ["email:leads"]}},
    "email": {"lists": {"leads": {"to": ["alice@example.com"]}}},
}


def test_a_link_cannot_be_minted_from_anything_in_redis(redis: Redis, link_secret: str) -> None:
    broker = Broker(redis, parse_config(EMAIL))
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 120}))
    redis.set("ab:secret", "the-key-an-older-version-kept-here")
    token = sign_link(broker, request.id, "alice@example.com", "approve", "n1", queue="default")
    assert read_link(broker, token, 60).request_id == request.id
    values = every_value(redis)
    assert values and not any(link_secret.encode() in v for v in values)
    for forged in forged_links(values, request.id, "alice@example.com", "n1"):
        with pytest.raises(LinkError) as refused:
            read_link(broker, forged, 60)
        assert refused.value.code == "link_invalid"


def test_a_link_secret_comes_from_the_config_before_the_environment(
    redis: Redis, link_secret: str
) -> None:
    configured = {**EMAIL, "email": {**EMAIL["email"], "link_secret": "c" * 40}}
    mine, env_only = Broker(redis, parse_config(configured)), Broker(redis, parse_config(EMAIL))
    token = sign_link(mine, "r1", "alice@example.com", "view", "n1")
    assert URLSafeTimedSerializer("c" * 40, salt=SALT).loads(token)["r"] == "r1"
    with pytest.raises(LinkError):
        read_link(env_only, token, 60)


def test_roles_on_the_embedded_redis_share_a_0600_secret_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV)
    with EmbeddedRedis(tmp_path / "redis") as server:
        settings = Settings(redis_url=running_url(tmp_path / "redis"), data_dir=tmp_path)
        api, notifier = parse_config(dict(EMAIL)), parse_config(dict(EMAIL))
        prepare_link_secret(settings, api)
        prepare_link_secret(settings, notifier)
        api_email, notifier_email = email_section(api), email_section(notifier)
        assert api_email and notifier_email
        assert api_email.link_secret == notifier_email.link_secret
        secret_file = tmp_path / "redis" / SECRET_FILE
        assert secret_file.read_text().strip() == api_email.link_secret
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        assert server.url == settings.redis_url


def test_a_fleet_with_email_and_no_secret_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV)
    elsewhere = Settings(redis_url="redis://redis.internal:6379/0", data_dir=tmp_path)
    with pytest.raises(ConfigError, match="no signing secret: set \\[email\\] link_secret"):
        prepare_link_secret(elsewhere, parse_config(dict(EMAIL)))
    short = {**EMAIL, "email": {**EMAIL["email"], "link_secret": "short"}}
    with pytest.raises(ConfigError, match="at least 32 characters"):
        prepare_link_secret(elsewhere, parse_config(short))
    prepare_link_secret(elsewhere, parse_config({}))  # no email: no secret needed
    assert not (tmp_path / "redis" / SECRET_FILE).exists()


@pytest.mark.parametrize("role", ["api", "notifier"])
def test_the_api_and_the_notifier_refuse_to_start_without_a_link_secret(
    role: str, tmp_path: Path, redis_url: str
) -> None:
    config = tmp_path / "approval-broker.toml"
    config.write_text(
        '[queues.default]\nchannels = ["email:leads"]\n[email.lists.leads]\nto = ["a@example.com"]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env |= {"APPROVAL_BROKER_REDIS_URL": redis_url, "APPROVAL_BROKER_CONFIG": str(config)}
    env["APPROVAL_BROKER_PORT"] = str(free_port())
    done = subprocess.run(
        [sys.executable, "-m", "approval_broker", role],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: email is configured but email links have no signing secret: set [email] "
        f'link_secret (e.g. "env:NAME") or {SECRET_ENV} (the same on every api and notifier)'
    ]


# ---- the whole of `up` --------------------------------------------------------------------


def test_up_keeps_its_redis_private_and_its_link_secret_out_of_redis(
    tmp_path: Path, smtp: SmtpSink
) -> None:
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    config = tmp_path / "approval-broker.toml"
    config.write_text(
        f"""
[queues.default]
channels = ["inbox", "email:leads"]
[email]
smtp_url = "{smtp.url}"
public_url = "{public}"
[email.lists.leads]
to = ["alice@example.com"]
[approvers.alice]
roles = ["finance"]
email = "alice@example.com"
"""
    )
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env |= {"APPROVAL_BROKER_ADMIN_TOKEN": ADMIN, "APPROVAL_BROKER_CONFIG": str(config)}
    up = subprocess.Popen(
        [sys.executable, "-m", "approval_broker", "up", "--port", str(port), "--data-dir", data],
        env=env | {"PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        http = httpx.Client(base_url=public, timeout=10)

        def healthy() -> bool:
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            try:
                return http.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=60, interval=0.1)
        auth = {"Authorization": f"Bearer {ADMIN}"}
        created = http.post(
            "/v1/requests", headers=auth, json={"tool_name": "refund", "args": {"amount": 9}}
        )
        assert created.status_code == 201, created.text
        rid = created.json()["id"]
        wait_for(lambda: smtp.to("alice@example.com"), timeout=30)
        mailed = re.findall(r"/v1/email/([A-Za-z0-9_.\-]+)", smtp.mails[0].part("plain"))
        assert mailed

        redis_dir = data / "redis"
        url = running_url(redis_dir)
        assert url is not None
        redis = Redis.from_url(url)
        assert raw_command(redis.connection_pool.connection_kwargs["port"], "KEYS", "*")[:7] == (
            b"-NOAUTH"
        )
        secret = (redis_dir / SECRET_FILE).read_text().strip()
        values = every_value(redis)
        assert len(values) > 10 and not any(secret.encode() in v for v in values)
        nonce = read_link(
            Broker(redis, parse_config({"email": {"link_secret": secret}})),
            mailed[0],
            60,
        ).nonce
        for forged in forged_links(values, rid, "alice@example.com", nonce):
            refused = http.post(f"/v1/email/{forged}")
            assert refused.status_code == 403 and 'data-error="link_invalid"' in refused.text
        assert http.get(f"/v1/requests/{rid}", headers=auth).json()["status"] == "pending"
        assert http.get(f"/v1/email/{mailed[0]}").status_code == 200  # the mailed one works
        redis.close()
        assert_private(redis_dir)
    finally:
        up.send_signal(2)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    password = (data / "redis" / PASSWORD_FILE).read_text().strip()
    assert password not in out and secret not in out and ADMIN not in out
    assert "admin token  from APPROVAL_BROKER_ADMIN_TOKEN" in out
