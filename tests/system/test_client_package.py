"""The client distribution installs alone: its wheel, in a fresh venv, imports, depends on httpx
and pydantic only (pydantic-ai-slim as the extra), brings no server package, and its
`BrokerApprovals` capability pauses an agent until a person approves on a live `up`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live_up import AGENT, LiveUp, start_live_up
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
SERVER_SIDE = ["broker", "api", "workers", "notifiers", "approval_broker", "fastapi", "rq",
               "redis", "slack_sdk", "fakeredis", "uvicorn"]  # fmt: skip


def run(*args: str, timeout: float = 300, cwd: Path | None = None) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


pytestmark = pytest.mark.timeout(
    900
)  # the first test also waits for `up` to start (slow on a busy machine)


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH: it builds the wheel and makes the venv")
    out = tmp_path_factory.mktemp("client-wheel")
    run(uv, "build", "--wheel", "--out-dir", str(out / "dist"), str(CLIENT))
    (wheel,) = (out / "dist").glob("approval_broker_client-*.whl")
    run(uv, "venv", "--python", sys.executable, str(out / "venv"))
    python = out / "venv" / "bin" / "python"
    run(uv, "pip", "install", "--python", str(python), f"{wheel}[pydantic-ai]")
    return python


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveUp]:
    live = start_live_up(tmp_path_factory.mktemp("up"))
    try:
        yield live
    finally:
        live.stop()


def in_venv(python: Path, code: str) -> str:
    """Run `code` isolated (-I: no cwd, no PYTHONPATH), so only the venv's packages are seen."""
    return run(str(python), "-I", "-c", code, cwd=python.parent)


def test_the_wheel_imports_its_api_with_no_server_package_beside_it(venv_python: Path) -> None:
    code = (
        "import importlib.util, json\n"
        "from approval_broker_client import (AsyncRemoteBroker, BrokerApprovals, RemoteBroker,"
        " Conflict, NotFound, Request, RoundNotReady, results_for)\n"
        f"print(json.dumps([m for m in {SERVER_SIDE!r} if importlib.util.find_spec(m)]))\n"
    )
    assert json.loads(in_venv(venv_python, code)) == []


def test_the_wheel_depends_on_httpx_and_pydantic_and_pydantic_ai_only_as_extra(
    venv_python: Path,
) -> None:
    code = (
        "import importlib.metadata as m, json\n"
        "print(json.dumps(m.requires('approval-broker-client')))\n"
    )
    requires = json.loads(in_venv(venv_python, code))
    plain = sorted(r.split(">")[0].split(";")[0].strip() for r in requires if "extra" not in r)
    extra = [r for r in requires if "extra" in r]
    assert plain == ["httpx", "pydantic"]
    # the capability's extra: pydantic-ai, and joserfc to verify approval receipts
    assert sorted(re.split(r"[<>=;]", r)[0].strip() for r in extra) == [
        "joserfc",
        "pydantic-ai-slim",
    ]
    assert all("extra == 'pydantic-ai'" in r for r in extra)


def test_the_installed_capability_waits_for_a_person_on_a_live_up(
    venv_python: Path, up: LiveUp
) -> None:
    script = str(Path(__file__).resolve().parents[1] / "support" / "client_pkg" / "agent_script.py")
    agent = subprocess.Popen(
        [str(venv_python), "-I", script, up.url, AGENT],
        cwd=venv_python.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with up.admin() as admin:

            def asked() -> list[dict]:
                got = admin.get("/v1/requests", params={"status": "pending"}).json()
                return [r for r in got if r["tool_name"] == "refund"]

            (request,) = wait_for(asked, timeout=60)
            assert request["args"] == {"order_id": "A1", "amount": 120}
            assert request["metadata"]["approval_broker"]["agent"] == "wheel-agent"
            decided = admin.post(f"/v1/requests/{request['id']}/decision",
                                 json={"outcome": "approved"})  # fmt: skip
            assert decided.status_code == 200, decided.text
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, err
    assert json.loads(out) == {"output": "done: refunded 120.0 on A1"}
