"""The README's Redis ACL user is enough for the whole fleet, and Redis refuses it anything else.

`up --demo` runs every role (api, worker + resumer, notifier, sweeper) as that user: two demo
runs are approved (over the API and by an email link) and the demo's question is answered, and
all three finish; a request times out, mail goes out. Redis's ACL LOG must then hold no refusal of the broker's.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from itsdangerous import URLSafeTimedSerializer
from redis import Redis
from redis.exceptions import NoPermissionError

from broker.redis.embedded import EmbeddedRedis, free_port
from channels.email.links import SECRET_ENV
from tests.support.acl_user import readme_user
from tests.support.fakes.smtp import SmtpSink
from tests.support.waiting import wait_for

ADMIN = "ab_test-admin-token-for-the-acl-fleet"


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[tuple[EmbeddedRedis, str]]:
    """An embedded Redis with the README's user; yields it and that user's URL."""
    with readme_user(tmp_path / "redis") as (server, _, url):
        yield server, url


def test_the_acl_user_is_refused_what_the_broker_never_needs(
    acl_redis: tuple[EmbeddedRedis, str],
) -> None:
    _, url = acl_redis
    user = Redis.from_url(url)
    user.set("ab:mine", "1")
    for refused in (
        lambda: user.get("someone-else:key"),
        lambda: user.flushall(),
        lambda: user.config_get("requirepass"),
        lambda: user.keys("*"),
        lambda: user.eval("return 1", 0),
    ):
        with pytest.raises(NoPermissionError):
            refused()
    user.close()


def test_a_fleet_runs_as_the_readme_acl_user(
    acl_redis: tuple[EmbeddedRedis, str], tmp_path: Path
) -> None:
    server, url = acl_redis
    smtp = SmtpSink().start()
    port = free_port()
    public = f"http://127.0.0.1:{port}"
    config = tmp_path / "approval-broker.toml"
    config.write_text(
        f"""
[queues.default]
channels = ["inbox", "email:leads"]
[queues.quick]
channels = ["inbox"]
timeout_s = 1
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
    link_secret = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env |= {
        "APPROVAL_BROKER_REDIS_URL": url,
        "APPROVAL_BROKER_CONFIG": str(config),
        "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN,
        SECRET_ENV: link_secret,
        "PYTHONUNBUFFERED": "1",
    }
    up = subprocess.Popen(
        [sys.executable, "-m", "approval_broker", "up", "--demo", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    http = httpx.Client(base_url=public, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    try:

        def pending() -> list[dict]:
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            try:
                found = http.get("/v1/requests", params={"status": "pending", "queue": "default"})
            except httpx.HTTPError:
                return []
            return found.json() if found.status_code == 200 else []

        waiting = wait_for(lambda: len(pending()) == 3 and pending(), timeout=90)
        by_api, by_mail = [r for r in waiting if r["kind"] == "approval"]
        [asked] = [r for r in waiting if r["kind"] == "question"]  # A105: card or store credit?
        question = asked["metadata"]["questions"][0]["question"]
        answer = {"answers": [{"question": question, "selected": ["Store credit"]}]}
        answered = http.post(
            f"/v1/requests/{asked['id']}/decision", json={"outcome": "answered", "answer": answer}
        )
        assert answered.status_code == 200, answered.text
        decided = http.post(f"/v1/requests/{by_api['id']}/decision", json={"outcome": "approved"})
        assert decided.status_code == 200, decided.text

        signer = URLSafeTimedSerializer(link_secret, salt="approval-broker.email-link:ab:")

        def approve_link() -> str | None:
            for mail in smtp.to("alice@example.com"):
                for token in re.findall(r"/v1/email/([A-Za-z0-9_.\-]+)", mail.part("plain")):
                    claims = signer.loads(token)
                    if claims["r"] == by_mail["id"] and claims["a"] == "approve":
                        return token
            return None

        token = wait_for(approve_link, timeout=30)
        assert httpx.post(f"{public}/v1/email/{token}").status_code == 200

        quick = http.post("/v1/requests", json={"tool_name": "t", "args": {}, "queue": "quick"})
        assert quick.status_code == 201, quick.text

        def run_status(run_id: str) -> str:
            return http.get(f"/v1/runs/{run_id}").json()["status"]

        for request in (by_api, by_mail, asked):
            wait_for(lambda r=request: run_status(r["run_id"]) == "finished", timeout=60)
        wait_for(
            lambda: http.get(f"/v1/requests/{quick.json()['id']}").json()["status"] == "timed_out",
            timeout=30,
        )
        admin = Redis.from_url(server.url)
        wait_for(lambda: admin.xlen("ab:audit:seals") > 0, timeout=30)  # sealed as that user
        refusals = [
            (e["reason"], e["object"], e["client-info"].get("cmd"))
            for e in admin.acl_log()
            if e["username"] == "approval-broker"
        ]
        # Redis < 7.2 has no CLIENT SETINFO, which redis-py sends on connecting and may be
        # refused; anything else refused is a command or key the README's user lacks
        assert [r for r in refusals if r[1] != "client"] == []
        names = [c["name"] for c in admin.client_list() if c.get("user") == "approval-broker"]
        assert any(n for n in names), "RQ's worker could not name its connection"
        admin.close()
    finally:
        http.close()
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
        smtp.stop()
    assert up.returncode == 0, out
    assert "NOPERM" not in out and "exited with" not in out, out
