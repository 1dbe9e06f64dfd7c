"""The channel setup pages (docs/slack.md, teams.md, telegram.md, discord.md): the config each
shows loads, `approval-broker config check` on it prints what the page says it prints, and
`approval-broker channels test` posts its sample card to the local fake of the platform,
printing the page's line.

Run as a reader does: the page's TOML saved as approval-broker.toml, the secrets it names in
the environment (made-up values of the right shape), the reader's own token hash for "...".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs_examples import blocks, page
from tests.support.fakes.discord import FakeDiscord
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.teams import FakeConnector
from tests.support.fakes.telegram import FakeTelegram

PAGES = ("slack.md", "teams.md", "telegram.md", "discord.md")
SECRETS = {
    "TELEGRAM_WEBHOOK_SECRET": "telegram-webhook-secret_0123456789",  # A-Z a-z 0-9 _ - only
    "DISCORD_PUBLIC_KEY": "ab" * 32,  # an Ed25519 public key, in hex
}


def console(text: str) -> tuple[str, list[str]]:
    """The page's `config check` console block: the command, and the lines it printed."""
    [block] = [b for b in blocks(text, "console") if "config check" in b]
    command, *printed = block.strip().splitlines()
    return command.removeprefix("$ "), printed


@pytest.mark.parametrize("name", PAGES)
def test_each_setup_pages_config_check_prints_what_the_page_shows(
    name: str, tmp_path: Path
) -> None:
    text = page(name)
    [config] = blocks(text, "toml")
    (tmp_path / "approval-broker.toml").write_text(config.replace('"..."', '"' + "0" * 64 + '"'))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    for secret in re.findall(r'"env:([A-Z_]+)"', config):
        env[secret] = SECRETS.get(secret, f"made-up-{secret.lower()}")
    command, printed = console(text)
    assert command == "approval-broker config check approval-broker.toml"
    done = subprocess.run(
        [sys.executable, "-m", "approval_broker", *command.split()[1:]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.splitlines() == printed


@pytest.mark.parametrize("name", PAGES)
def test_each_setup_page_says_where_everything_comes_from(name: str) -> None:
    """The parts a reader needs, by their headings, and the test message to come named."""
    text = page(name)
    headings = re.findall(r"^## \d\. (.+)$", text, flags=re.M)
    assert len(headings) == 6, headings
    assert any(h.startswith("Check it") for h in headings)
    kind = name.removesuffix(".md")
    assert re.search(rf"`approval-broker channels test\s+{kind}:\w+`", text)
    assert f"https://YOUR-HOST/v1/{kind}/" in text  # the URL the platform is given


def pointed_at(kind: str, config: str, fake_url: str) -> str:
    """The page's config with the platform's address swapped for the local fake's (Teams in
    the SDK's anonymous mode: the fake connector issues no Entra ID token)."""
    if kind == "teams":
        config = re.sub(r"^(app_id|app_password|tenant_id) = .*\n", "", config, flags=re.M)
        config = config.replace("[teams]\n", "[teams]\nallow_anonymous = true\n")
        return re.sub(r'^service_url = ".*"', f'service_url = "{fake_url}"', config, flags=re.M)
    return config.replace(f"[{kind}]\n", f'[{kind}]\napi_base_url = "{fake_url}/"\n')


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The page's platform, local: it checks what the platform checks."""
    kind = request.param
    if kind == "slack":
        server: Any = FakeSlack().start()
    elif kind == "telegram":
        server = FakeTelegram().start()
    elif kind == "discord":
        server = FakeDiscord().start()
    else:
        server = FakeConnector(("19:0a1b2c3d4e5f@thread.tacv2",)).start()
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("name", "fake"), [(p, p.removesuffix(".md")) for p in PAGES], indirect=["fake"]
)
def test_each_setup_pages_channels_test_prints_what_the_page_shows(
    name: str, fake: Any, tmp_path: Path
) -> None:
    """The page's `channels test`, run on its config against the local fake, prints the
    page's line (but for the message id the platform gives)."""
    text = page(name)
    kind = name.removesuffix(".md")
    [config] = blocks(text, "toml")
    config = pointed_at(kind, config.replace('"..."', '"' + "0" * 64 + '"'), fake.url.rstrip("/"))
    (tmp_path / "approval-broker.toml").write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    for secret in re.findall(r'"env:([A-Z_]+)"', config):
        env[secret] = SECRETS.get(secret, f"made-up-{secret.lower()}")
        if secret.endswith("_BOT_TOKEN"):
            env[secret] = fake.token  # the one the fake platform accepts
    env["APPROVAL_BROKER_CONFIG"] = str(tmp_path / "approval-broker.toml")
    [block] = [b for b in blocks(text, "console") if "channels test" in b]
    command, printed = block.strip().splitlines()
    assert command == f"$ approval-broker channels test {kind}:" + command.rsplit(":", 1)[1]
    done = subprocess.run(
        [sys.executable, "-m", "approval_broker", *command.removeprefix("$ ").split()[1:]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    id_of = re.compile(r"posted \S+$")
    assert id_of.sub("posted ID", done.stdout.strip()) == id_of.sub("posted ID", printed)
