"""People and their bearer tokens, as config and as HTTP headers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from broker.domain.principals import hash_token


def bearer(token: str) -> dict[str, str]:
    """The headers of a request made with `token`."""
    return {"Authorization": f"Bearer {token}"}


def person(token: str, roles: list[str]) -> dict[str, Any]:
    """An `[approvers.NAME]` entry: the token's hash (never the token) and the roles."""
    return {"token_sha256": hash_token(token), "roles": roles}


def bearer_by_name(tokens: Mapping[str, str]) -> Callable[[str], dict[str, str]]:
    """`auth = bearer_by_name(TOKENS)`, then `auth("bob")`: the headers of a person named in a
    module's token table."""
    return lambda name: bearer(tokens[name])
