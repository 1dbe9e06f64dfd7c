"""What the deploy manifests' checks share: dummy secrets and the env names a config reads."""

from __future__ import annotations

import base64
import tomllib
from collections.abc import Iterator
from typing import Any


def config_env_names(text: str) -> set[str]:
    """The NAMEs of every `env:NAME` secret a TOML config refers to."""

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)
        elif isinstance(node, str) and node.startswith("env:"):
            yield node[4:]

    return set(walk(tomllib.loads(text)))


DUMMY_SECRETS = {
    "SLACK_BOT_TOKEN": "xoxb-0000-dummy",
    "SLACK_SIGNING_SECRET": "dummy-signing-secret",
    "OPS_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"dummy webhook secret 24b!").decode(),
    "SMTP_PASSWORD": "dummy-smtp-password",
    "EMAIL_LINK_SECRET": "dummy-email-link-secret-of-32-chars-or-more",
}
