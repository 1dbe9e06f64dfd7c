"""The base install, as a user gets it without extras: built wheels installed into a fresh
virtual environment with no `[teams]` and no `[testing]`.

It has neither the Microsoft 365 Agents SDK nor fakeredis and lupa (nor PyNaCl: Discord's
signatures are checked with `cryptography`); a config with `[teams]` is refused in one line
naming the extra by `config check`, `up`, the API and the notifier, before any Redis starts;
`import broker.testing` says which extra it needs; a config without Teams still checks ok.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs_examples import ROOT

pytestmark = pytest.mark.timeout(900)  # two wheels built and an environment installed

TEAMS = """
[teams]
app_id = "00000000-0000-0000-0000-000000000000"
app_password = "not-a-real-secret"
[teams.channels.ops]
conversation_id = "19:ops@thread.tacv2"
service_url = "http://127.0.0.1:9/"
[queues.default]
channels = ["inbox", "teams:ops"]
"""

TEAMS_MISSING = (
    "config {path}: [teams] is configured but the Teams extra is not installed"
    " (no module microsoft_agents): uv add 'approval-broker[teams]'"
)

SLACK = """
[slack]
bot_token = "xoxb-not-real"
signing_secret = "not-a-real-signing-secret"
[slack.channels.approvals]
channel = "C0123456789"
[queues.default]
channels = ["slack:approvals"]
"""


def clean_env(home: Path) -> dict[str, str]:
    gone = ("VIRTUAL_ENV", "PYTHONPATH", "UV_PROJECT_ENVIRONMENT", "UV_PROJECT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in gone and not k.startswith("APPROVAL_BROKER_")
    }
    env["XDG_STATE_HOME"] = str(home / "state")  # no running broker of another test is found
    return env


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding the wheels built from this checkout, without extras."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH (CI installs it)")
    home = tmp_path_factory.mktemp("base-install")
    dist = home / "dist"
    env = clean_env(home)
    for where in (ROOT, ROOT / "clients" / "python"):
        subprocess.run(
            [uv, "build", "--wheel", "--out-dir", str(dist), str(where)],
            cwd=ROOT, env=env, check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    venv = home / "venv"
    subprocess.run(
        [uv, "venv", "--python", os.path.realpath(sys.executable), str(venv)],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    wheels = sorted(str(w) for w in dist.glob("*.whl"))
    subprocess.run(
        [uv, "pip", "install", "--python", str(venv / "bin" / "python"), *wheels],
        env=env, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return venv


def run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        cwd=cwd, env=clean_env(cwd), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_base_install_has_no_teams_sdk_no_fakeredis_no_lupa(base: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib.util as u; "
        "print([m for m in ('microsoft_agents', 'fakeredis', 'lupa', 'nacl', 'broker', 'channels')"
        " if u.find_spec(m)])"
    )
    found = run(base, "python", "-c", probe, cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "['broker', 'channels']"


@pytest.mark.parametrize("command", [["config", "check"], ["up"], ["api"], ["notifier"]])
def test_a_configured_channel_whose_extra_is_missing_is_one_line_naming_it(
    base: Path, tmp_path: Path, command: list[str]
) -> None:
    config = tmp_path / "approval-broker.toml"
    config.write_text(TEAMS)
    args = [*command, str(config)] if command[0] == "config" else command
    env_args = [] if command[0] == "config" else ["--data-dir", str(tmp_path / "data")]
    done = subprocess.run(
        [str(base / "bin" / "approval-broker"), *args, *env_args],
        cwd=tmp_path,
        env=clean_env(tmp_path) | {"APPROVAL_BROKER_CONFIG": str(config)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == f"error: {TEAMS_MISSING.format(path=config)}\n"
    assert not (tmp_path / "data" / "redis").exists()  # refused before any Redis started


def test_broker_testing_without_the_testing_extra_names_it(base: Path, tmp_path: Path) -> None:
    done = run(base, "python", "-c", "import broker.testing", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ModuleNotFoundError: broker.testing needs the testing extra, which is not installed"
        " (no module fakeredis): uv add 'approval-broker[testing]'"
    )


def test_a_config_without_teams_checks_ok_on_the_base_install(base: Path, tmp_path: Path) -> None:
    config = tmp_path / "approval-broker.toml"
    config.write_text(SLACK)
    done = run(base, "approval-broker", "config", "check", str(config), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"config {config}: ok" in done.stdout
    assert "channel slack:approvals" in done.stdout
