"""The channel setup pages (docs/slack.md, teams.md, telegram.md, discord.md): the config each
shows loads, and `approval-broker config check` on it prints what the page says it prints.

Run as a reader does: the page's TOML saved as approval-broker.toml, the secrets it names in
the environment (made-up values of the right shape), the reader's own token hash for "...".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs_examples import blocks, page

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
