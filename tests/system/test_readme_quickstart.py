"""README's quickstart, run as written against a live `approval-broker up`: an agent of the
user's own in their own process (the `BrokerApprovals` capability), and one on the fleet
(its module importable from the directory `up` runs in, started and read with the README's
curl commands)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from approval_broker_client import RemoteBroker

from broker.redis.embedded import free_port
from tests.support.docs_examples import blocks, page
from tests.support.proc import alive, descendants
from tests.support.up import ADMIN, healthy, stop_up, up_command
from tests.support.waiting import wait_for

README = page("README.md")

AGENT_MODULE = """
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel


def model(messages, info):
    returned = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"done: {returned[-1].content}")])
    return ModelResponse(parts=[ToolCallPart("issue_refund", {"order_id": "A103", "amount": 120})])


refunds_agent = Agent(FunctionModel(model), output_type=[str, DeferredToolRequests])


@refunds_agent.tool_plain(requires_approval=True)
def issue_refund(order_id: str, amount: float) -> str:
    return f"refunded ${amount:.2f} on order {order_id}"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The user's project: `myapp/agents.py` and the README's config file."""
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "agents.py").write_text(AGENT_MODULE)
    [config] = [b for b in blocks(README, "toml") if "[agents.refunds]" in b]
    (tmp_path / "approval-broker.toml").write_text(config)
    return tmp_path


@pytest.fixture
def live_up(project: Path) -> Iterator[str]:
    """`APPROVAL_BROKER_CONFIG=approval-broker.toml PYTHONPATH=. approval-broker up`, in the
    project's directory, as the README starts it."""
    [shell] = [b for b in blocks(README, "sh") if "PYTHONPATH=." in b]
    assert (
        "APPROVAL_BROKER_CONFIG=approval-broker.toml PYTHONPATH=. uv run approval-broker up"
        in shell
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env.update(
        APPROVAL_BROKER_CONFIG="approval-broker.toml",
        PYTHONPATH=".",
        APPROVAL_BROKER_ADMIN_TOKEN=ADMIN,
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.Popen(
        up_command(port, project / "data"),
        cwd=project,
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


def test_the_fleet_quickstart_runs_as_written(live_up: str) -> None:
    [shell] = [b for b in blocks(README, "sh") if "PYTHONPATH=." in b]
    start, read = [line for line in shell.splitlines() if line.startswith("curl")]
    start = (
        start.removesuffix("\\").rstrip()
        + " "
        + shell.splitlines()[shell.splitlines().index(start) + 1].strip()
    )
    env = {**os.environ, "TOKEN": ADMIN}
    started = subprocess.run(
        ["bash", "-c", start.replace("localhost:8000", live_up)],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    run_id = re.search(r'"run_id":\s*"([^"]+)"', started.stdout).group(1)  # type: ignore[union-attr]
    stop = threading.Event()
    person = threading.Thread(target=approve_everything, args=(live_up, stop), daemon=True)
    person.start()
    read_cmd = read.split("#")[0].replace("localhost:8000", live_up).replace("RUN_ID", run_id)

    def finished() -> dict | None:
        out = subprocess.run(["bash", "-c", read_cmd], env=env, capture_output=True, text=True)
        run = httpx.Response(200, content=out.stdout).json()
        return run if run["status"] in ("finished", "failed") else None

    try:
        run = wait_for(finished, timeout=60, interval=0.2)
    finally:
        stop.set()
        person.join(10)
    assert run["status"] == "finished", run
    assert run["output"] == "done: refunded $120.00 on order A103"


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
