"""README's quickstart 1, run as written against a live `approval-broker up`: an agent of the
user's own in their own process (the `BrokerApprovals` capability). Quickstart 2, the agent on
the fleet from a project of one's own, is tests/system/test_own_project.py."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.redis.embedded import free_port
from broker.remote import RemoteBroker
from tests.support.docs_examples import blocks, page
from tests.support.proc import alive, descendants
from tests.support.up import ADMIN, healthy, stop_up, up_command
from tests.support.waiting import wait_for

README = page("README.md")


@pytest.fixture
def live_up(tmp_path: Path) -> Iterator[str]:
    """`approval-broker up` in a folder of the reader's: the broker quickstart 1's agent asks."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env.update(APPROVAL_BROKER_ADMIN_TOKEN=ADMIN, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        up_command(port, tmp_path / "data"),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: healthy(url) or proc.poll() is not None, timeout=90)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        yield url
    finally:
        family = descendants(proc.pid)
        try:
            stop_up(proc)  # Ctrl-C, as a user stops it: up stops its roles and its Redis
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid in family:  # whatever did not stop with it
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def approve_everything(url: str, stop: threading.Event) -> None:
    """A person in the inbox: approves whatever waits until told to stop."""
    with RemoteBroker(url, ADMIN) as client:
        while not stop.is_set():
            for request in client.list_requests(status="pending"):
                client.approve(request.id)
            stop.wait(0.05)


def test_the_in_process_quickstart_runs_as_written(live_up: str, monkeypatch) -> None:
    [code] = [b for b in blocks(README, "python") if "BrokerApprovals" in b]
    assert '"openai:gpt-4o-mini"' in code and '"http://127.0.0.1:8000"' in code
    code = code.replace('"openai:gpt-4o-mini"', '"test"').replace(
        '"http://127.0.0.1:8000"', repr(live_up)
    )
    monkeypatch.setenv("BROKER_TOKEN", ADMIN)
    stop = threading.Event()
    person = threading.Thread(target=approve_everything, args=(live_up, stop), daemon=True)
    person.start()
    namespace: dict[str, object] = {}
    try:
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    finally:
        stop.set()
        person.join(10)
    with RemoteBroker(live_up, ADMIN) as client:
        [request] = client.list_requests()
    assert request.tool_name == "issue_refund" and request.status == "approved"
