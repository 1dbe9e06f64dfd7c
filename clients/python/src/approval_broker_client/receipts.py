"""Checking an approval receipt where the tool runs, outside the fleet (`BrokerApprovals`).

Just before an approved tool runs, its request's receipt is verified here against the broker's
JWKS (`GET /.well-known/jwks.json`): signature, issuer, expiry, request, tool and the hash of
the args about to run. Then it is spent at the broker (`POST /v1/requests/{id}/receipt/spend`),
which checks it again with what only the broker knows (the approver's current roles, whether
the jti was used) and spends the jti once. Any refusal means the tool does not run.
Needs the `pydantic-ai` extra (joserfc).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from typing import Any, cast

from joserfc import jwt
from joserfc.errors import JoseError, SecurityWarning
from joserfc.jwk import KeySet, KeySetSerialization

# EdDSA is the broker's receipt alg (the contract); see the broker's docs/receipts.md.
warnings.filterwarnings("ignore", message="EdDSA is deprecated", category=SecurityWarning)

ISSUER = "approval-broker"
LEEWAY_S = 5
REFUSED_TEXT = "the approval could not be verified"


class ReceiptRefused(Exception):
    """A receipt that does not prove the call about to run; `reason` names why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def args_hash(args: Any) -> str:
    """sha256 of the canonical JSON of args (sorted keys, no spaces, UTF-8), as the broker."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def verify_receipt(
    jwks: dict[str, Any],
    token: str | None,
    *,
    request_id: str,
    tool_name: str,
    args: dict[str, Any],
    now: float | None = None,
) -> dict[str, Any]:
    """The receipt's claims if it proves that `tool_name` may run with `args` for request
    `request_id` now; else `ReceiptRefused`."""
    if not token:
        raise ReceiptRefused("missing", "the decision carries no receipt")
    try:
        keys = KeySet.import_key_set(cast(KeySetSerialization, jwks))  # joserfc checks its shape
        claims = dict(jwt.decode(token, keys, algorithms=["EdDSA"]).claims)
    except JoseError as exc:
        raise ReceiptRefused("bad_signature", exc.error) from None
    except (ValueError, TypeError) as exc:
        raise ReceiptRefused("malformed", str(exc)) from None
    t = time.time() if now is None else now
    checks = (
        ("wrong_issuer", claims.get("iss") == ISSUER),
        ("expired", isinstance(claims.get("exp"), int) and claims["exp"] + LEEWAY_S >= t),
        ("other_request", claims.get("sub") == request_id),
        ("wrong_tool", claims.get("tool_name") == tool_name),
        ("args_changed", claims.get("args_hash") == args_hash(args)),
    )
    for reason, ok in checks:
        if not ok:
            raise ReceiptRefused(reason, f"the receipt of request {request_id} fails {reason}")
    return claims
