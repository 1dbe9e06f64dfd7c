"""People and their bearer tokens, as config and as HTTP headers."""

from __future__ import annotations

from typing import Any

from broker.auth import hash_token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def person(token: str, roles: list[str]) -> dict[str, Any]:
    return {"token_sha256": hash_token(token), "roles": roles}
