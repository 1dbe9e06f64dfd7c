"""Shared parts of the receipt tests (no tests here): key files and a config with receipts on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker.domain.config import Config, parse_config
from broker.domain.receipts import new_key_pem


def key_file(directory: Path, name: str = "receipts.pem") -> Path:
    path = directory / name
    path.write_bytes(new_key_pem())
    path.chmod(0o600)
    return path


def receipts_config(key: Path, **receipts: Any) -> dict[str, Any]:
    """Two queues as the conftest's `config`, approvers ann (finance) and bob (finance), and
    `[receipts]` on with `key`."""
    return {
        "queues": {
            "default": {"channels": ["inbox"], "timeout_s": 600, "escalate_to": "managers"},
            "managers": {"channels": ["inbox"], "timeout_s": 1800},
        },
        "approvers": {
            "ann": {"roles": ["finance"]},
            "bob": {"roles": ["finance"]},
        },
        "receipts": {"key_file": str(key), **receipts},
    }


def with_receipts(key: Path, **receipts: Any) -> Config:
    return parse_config(receipts_config(key, **receipts))
