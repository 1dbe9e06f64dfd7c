"""`approval-broker up` as a user runs it: healthy, one approval over HTTP, Ctrl-C leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from approval_broker.up import banner
from approval_broker.up_roles import MAX_DEFAULT_WORKERS, default_workers, roles
from broker.domain.settings import Settings
from tests.support.proc import alive, descendants
from tests.support.up import ADMIN, healthy, start_up, stop_up, up_command  # noqa: F401
from tests.support.waiting import wait_for


@pytest.fixture
def up(tmp_path: Path):
    proc, url = start_up(tmp_path)
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_runs_an_approval_and_stops_cleanly(up):
    proc, url = up
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=url, headers=auth, timeout=10) as http:
        assert "Approvals inbox" in http.get("/").text
        created = http.post(
            "/v1/requests", json={"tool_name": "delete_user", "args": {"user": "u-7"}}
        )
        assert created.status_code == 201, created.text
        rid = created.json()["id"]
        assert [r["id"] for r in http.get("/v1/requests", params={"status": "pending"}).json()] == [
            rid
        ]
        decided = http.post(f"/v1/requests/{rid}/decision", json={"outcome": "approved"})
        assert decided.status_code == 200 and decided.json()["status"] == "approved"
        assert http.get(f"/v1/requests/{rid}").json()["decision"]["decided_by"] == "admin"

    family = descendants(proc.pid)
    assert len(family) >= 5  # redis-server, api, worker, notifier, sweeper (and their forks)
    out = stop_up(proc)
    assert proc.returncode == 0, out
    # every role stops cleanly: none aborts at interpreter shutdown (its stdin watcher)
    assert "Fatal Python error" not in out and "Traceback" not in out, out
    assert "inbox" in out and url in out
    # no --workers: one agent worker process per core, at most MAX_DEFAULT_WORKERS
    assert out.count("[up] starting worker") == default_workers(), out
    assert f"[up] {default_workers()} agent worker process(es): one per core" in out, out
    assert ADMIN not in out and "admin token  from APPROVAL_BROKER_ADMIN_TOKEN" in out
    left = [pid for pid in family if alive(pid)]
    assert left == [], f"processes left behind: {left}"
    assert not healthy(url)


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_roles_stop_themselves_when_up_is_sigkilled(up):
    proc, _url = up
    family = descendants(proc.pid)
    redis = {pid for pid in family if "redis-server" in _command_line(pid)}
    roles = family - redis
    assert len(roles) >= 4  # api, worker, notifier, sweeper
    proc.kill()  # no Ctrl-C, no SIGTERM: up can't stop anything itself
    proc.wait()
    try:
        wait_for(lambda: not any(alive(pid) for pid in roles), timeout=60)
    finally:
        for pid in redis | {pid for pid in roles if alive(pid)}:
            os.kill(pid, signal.SIGKILL)


def worker_processes(up_pid: int) -> list[int]:
    return [pid for pid in descendants(up_pid) if _command_line(pid).endswith(" worker ")]


def test_up_starts_as_many_worker_processes_as_asked(tmp_path: Path):
    assert roles(1).count(("worker",)) == 1
    proc, url = start_up(tmp_path, "--workers", "3")
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        wait_for(lambda: len(worker_processes(proc.pid)) == 3, timeout=30)
        out = stop_up(proc)
        assert proc.returncode == 0, out
        assert out.count("[up] starting worker") == 3, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_defaults_to_one_worker_process_per_core_at_most_four(monkeypatch) -> None:
    for cores, expected in ((1, 1), (2, 2), (4, 4), (16, MAX_DEFAULT_WORKERS)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert default_workers() == expected


def test_up_refuses_a_port_in_use(tmp_path: Path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            up_command(port, tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == f"error: 127.0.0.1:{port} is already in use (another approval-broker?); pass --port"
    )


def test_banner_shows_the_admin_token_only_when_up_made_it_and_never_the_redis_password():
    settings = Settings(redis_url="redis://:hunter2-password@127.0.0.1:6390/0")
    made = banner(settings, "ab_made-here", True, [])
    given = banner(settings, "ab_given-by-env", False, [])
    assert "ab_made-here   (generated;" in made
    assert "ab_given-by-env" not in given and "from APPROVAL_BROKER_ADMIN_TOKEN" in given
    assert "hunter2" not in made + given and "redis://:***@127.0.0.1:6390/0" in given
    assert "question" not in made  # no demo: no demo lines


def test_banner_names_each_demo_run_and_what_it_shows():
    text = banner(Settings(redis_url="redis://x"), "t", False, ["run_a", "run_b"], "run_r", "run_q")
    assert "demo runs    run_a, run_b (their approvals wait in the inbox)" in text
    assert "rule demo    run_r (its refund is approved by rule demo-routine-refunds)" in text
    assert "question     run_q (order A105: card or store credit? the inbox shows its form)" in text
