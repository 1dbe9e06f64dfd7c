"""README's quickstart 2, as a reader does it: a real `uv init --package` project outside the
checkout, the server added from the checkout's path and, again, from wheels built from it, the
README's agent module (a FunctionModel in place of its OpenAI model) and config, then
`uv run approval-broker up` in the app's folder with no PYTHONPATH, a run started over HTTP
with the README's curl, its request approved over HTTP, and the run finished.

"As written" allows what a reader changes: `/path/to/approval-broker` is this checkout, the wheels
go to a folder of the test's (not the checkout's `dist/`), `up` gets a free port and a data dir,
`localhost:8000` its address, `$TOKEN` its admin token, `RUN_ID` the run's id. uv runs with the
interpreter of this test run (`UV_PYTHON`), so no Python is downloaded, and its cache makes the
installs quick.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.redis.embedded import free_port
from tests.support.docs_examples import ROOT, blocks, page
from tests.support.proc import alive, descendants
from tests.support.up import ADMIN, healthy, stop_up
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(900)  # two projects' installs and `up`s on a loaded machine

README = page("README.md")
CHECKOUT = "/path/to/approval-broker"

FUNCTION_MODEL = """
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel


def model(messages, info):
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"done: {returned[-1].content}")])
    return ModelResponse(parts=[ToolCallPart("issue_refund", {"order_id": "A103", "amount": 120})])
"""


def block(language: str, holding: str) -> str:
    [found] = [b for b in blocks(README, language) if holding in b]
    return found


def commands(text: str) -> list[str]:
    """A shell block's commands: continued lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", "", text)
    return [ln.split("  #")[0].strip() for ln in joined.splitlines() if ln.strip() and not ln.startswith("#")]  # fmt: skip


def uv_env() -> dict[str, str]:
    """The reader's shell: no project of ours, no PYTHONPATH, the test run's interpreter."""
    gone = ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT", "UV_PROJECT")
    env = {k: v for k, v in os.environ.items() if k not in gone and not k.startswith("APPROVAL_BROKER_")}  # fmt: skip
    env["UV_PYTHON"] = os.path.realpath(sys.executable)
    return env


def sh(command: str, cwd: Path, timeout: float = 600) -> str:
    """Run a README command as a reader's shell would. One killed by a signal is run once more
    (a loaded CI run once saw `uv add` end in SIGSEGV after it had installed every package:
    uv's crash, not the instructions'); a command that fails exits non-zero and fails at once."""

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command], cwd=cwd, env=uv_env(), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    done = run()
    if done.returncode < 0:
        done = run()
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def uv() -> str:
    found = shutil.which("uv")
    if found is None:
        pytest.skip("uv is not on PATH (CI installs it)")
    return found


@pytest.fixture(scope="module")
def wheels(uv: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's build line, run in the checkout, its wheels written to a folder of ours."""
    out = tmp_path_factory.mktemp("wheels") / "dist"
    [build] = commands(block("sh", "uv build --wheel"))[:1]
    sh(build.replace("--out-dir dist", f"--out-dir {out}"), cwd=ROOT)
    return out


def app_project(home: Path, add: str) -> Path:
    """`uv init --package myapp`, the server added with `add`, the README's agent and config."""
    init, add_line = commands(block("sh", "uv init --package myapp"))
    assert init == "uv init --package myapp && cd myapp"
    assert add_line == f"uv add {CHECKOUT}"
    sh(init.removesuffix(" && cd myapp"), cwd=home)
    app = home / "myapp"
    sh(add, cwd=app)
    agent = block("python", "refunds_agent = Agent(")
    assert '"openai:gpt-4o-mini"' in agent
    module = FUNCTION_MODEL + agent.replace('"openai:gpt-4o-mini"', "FunctionModel(model)")
    (app / "src" / "myapp" / "agents.py").write_text(module)
    (app / "approval-broker.toml").write_text(block("toml", "[agents.refunds]"))
    return app


@pytest.fixture
def up_in(request: pytest.FixtureRequest) -> Iterator[list[subprocess.Popen[str]]]:
    """Whatever `up` a test starts is stopped (Ctrl-C), with anything left of its family."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        family = descendants(proc.pid)
        try:
            stop_up(proc)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid in family:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def run_the_quickstart(app: Path, started: list[subprocess.Popen[str]]) -> dict:
    """README's `up` line in the app's folder, its curl lines, an approval over HTTP."""
    start_up, start_run, read_run = commands(block("sh", "approval-broker.toml uv run"))
    assert start_up == "APPROVAL_BROKER_CONFIG=approval-broker.toml uv run approval-broker up"
    port = free_port()
    env = uv_env() | {"APPROVAL_BROKER_ADMIN_TOKEN": ADMIN, "PYTHONUNBUFFERED": "1"}
    assignment, command = start_up.split(" uv run ", 1)  # exec: Ctrl-C reaches uv, not bash
    proc = subprocess.Popen(
        ["bash", "-c", f"{assignment} exec uv run {command} --port {port} --data-dir {app / 'data'}"],
        cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    started.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: healthy(url) or proc.poll() is not None, timeout=300)
    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    as_reader = {**uv_env(), "TOKEN": ADMIN}

    def curl(command: str) -> httpx.Response:
        done = subprocess.run(
            ["bash", "-c", command.replace("localhost:8000", url.removeprefix("http://"))],
            env=as_reader, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return httpx.Response(200, content=done.stdout)

    run_id = curl(start_run).json()["run_id"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10) as http:  # fmt: skip
        waiting = wait_for(
            lambda: [r for r in http.get("/v1/requests", params={"status": "pending"}).json() if r["run_id"] == run_id],  # fmt: skip
            timeout=120, interval=0.2,
        )  # fmt: skip
        [request] = waiting
        assert (request["tool_name"], request["args"]) == ("issue_refund", {"order_id": "A103", "amount": 120})  # fmt: skip
        decided = http.post(f"/v1/requests/{request['id']}/decision", json={"outcome": "approved"})
        assert decided.status_code == 200, decided.text
    return wait_for(
        lambda: (r := curl(read_run.replace("RUN_ID", run_id)).json())["status"] in ("finished", "failed") and r,  # fmt: skip
        timeout=120, interval=0.2,
    )  # fmt: skip


@pytest.mark.parametrize("source", ["checkout", "wheels"])
def test_readme_quickstart_2_runs_in_a_project_of_ones_own(
    source: str,
    uv: str,
    tmp_path_factory: pytest.TempPathFactory,
    up_in: list[subprocess.Popen[str]],
    request: pytest.FixtureRequest,
) -> None:
    home = tmp_path_factory.mktemp(f"own-project-{source}")
    if source == "checkout":
        add = f"uv add {ROOT}"
    else:
        dist = request.getfixturevalue("wheels")
        [_, add] = commands(block("sh", "uv build --wheel"))[:2]
        add = add.replace(f"{CHECKOUT}/dist", str(dist))
        assert str(dist) in add and add.count(".whl") == 2
    app = app_project(home, add)
    assert not (Path(app) / "src" / "myapp").is_relative_to(ROOT)
    run = run_the_quickstart(app, up_in)
    assert run["status"] == "finished", run
    assert run["output"] == "done: refunded $120.00 on order A103"
