"""The docs' examples run as written: the broker.testing example, and every config example loads."""

from __future__ import annotations

import re

import pytest

from broker.domain import channel_kinds
from broker.domain.config import parse_config
from tests.support import fakechat
from tests.support.docs_examples import blocks as code_blocks
from tests.support.docs_examples import every_page, page


def blocks(language: str) -> list[str]:
    return code_blocks(every_page(), language)


def test_the_broker_testing_example_runs_as_shown() -> None:
    [example] = [b for b in code_blocks(page("testing.md"), "python") if "InMemoryBroker" in b]
    namespace: dict[str, object] = {}
    exec(compile(example, "docs/testing.md", "exec"), namespace)  # noqa: S102 - our own docs
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    assert tests, "the docs example defines no test"
    for test in tests:
        test()


def test_every_toml_example_is_a_valid_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib

    examples = blocks("toml")
    assert len(examples) >= 2
    with channel_kinds.registered(fakechat.plugin):  # the kind docs/adding-a-channel.md adds
        for example in examples:
            raw = tomllib.loads(
                example.replace('"…"', '"' + "0" * 64 + '"').replace('"..."', '"' + "0" * 64 + '"')
            )
            for name in re.findall(r'"env:([A-Z_]+)"', example):
                value = "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1vcHMtd2ViaG9vayE="
                if name == "TELEGRAM_WEBHOOK_SECRET":  # Telegram allows A-Z a-z 0-9 _ - only
                    value = "telegram-webhook-secret_0123456789"
                elif name == "DISCORD_PUBLIC_KEY":  # an Ed25519 public key, in hex
                    value = "ab" * 32
                monkeypatch.setenv(name, value)
            parse_config(raw)
