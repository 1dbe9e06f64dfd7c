"""The README's examples run as written: the broker.testing example, and the config examples load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.config import parse_config

README = (Path(__file__).parent.parent / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_the_broker_testing_example_runs_as_shown() -> None:
    [example] = [b for b in blocks("python") if "InMemoryBroker" in b]
    namespace: dict[str, object] = {}
    exec(compile(example, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    assert tests, "the README example defines no test"
    for test in tests:
        test()


def test_every_toml_example_is_a_valid_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib

    examples = blocks("toml")
    assert len(examples) >= 2
    for example in examples:
        raw = tomllib.loads(
            example.replace('"…"', '"' + "0" * 64 + '"').replace('"..."', '"' + "0" * 64 + '"')
        )
        for name in re.findall(r'"env:([A-Z_]+)"', example):
            monkeypatch.setenv(name, "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1vcHMtd2ViaG9vayE=")
        parse_config(raw)
