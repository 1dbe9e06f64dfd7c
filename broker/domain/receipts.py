"""Approval receipts: a signed statement of what a decision allows, checked where the tool runs.

An approved, modified or answered decision carries `receipt`, a compact JWS (alg `EdDSA`, an
Ed25519 key) whose claims name the request, the tool, the call, the run, the hash of the args
to run, the outcome and who decided (`docs/receipts.md`). It is made here and only here
(`Receipts.stamp`), by the step's caller just before the atomic step that stores the decision,
so the receipt and the decision are written together or not at all. The check at execution
(`Receipts.verify`) is here too: the worker's tool guard and the API's spend route call it.

This module never touches Redis and never decides who may decide (`broker.judge.deciding` does):
it signs what was decided and says whether a receipt still proves it.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approval_broker_client.receipts import ISSUER, LEEWAY_S
from approval_broker_client.receipts import REFUSED_TEXT as REFUSED_TEXT
from approval_broker_client.receipts import ReceiptRefused as ReceiptRefused
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet, OKPKey

from broker.domain.args_hash import args_hash
from broker.domain.errors import ConfigError
from broker.domain.models import Decision, Outcome

# `EdDSA` is the contract's alg: every JOSE library verifies it. RFC 9864's `Ed25519` names the
# same signature, but fewer libraries accept it yet, so joserfc's notice about it is not news
# (the client's module, imported above, tells `warnings` so). The issuer, the leeway, the text
# the model is told and `ReceiptRefused` are the client's: one definition for both checkers.
ALG = "EdDSA"
DEFAULT_TTL_S = 900.0
RECEIPT_OUTCOMES = frozenset({Outcome.approved, Outcome.modified, Outcome.answered})

REASONS = (
    "missing",  # the decision carries no receipt
    "malformed",  # not a compact JWS, or claims of the wrong types
    "unknown_key",  # signed by a key the JWKS does not hold (never, or no longer)
    "bad_signature",  # the signature does not match header and claims
    "wrong_issuer",
    "expired",
    "other_request",  # a receipt for another request (or another call)
    "wrong_tool",
    "args_changed",  # the args about to run are not the args approved
    "wrong_outcome",  # the receipt allows nothing (not approved, modified or answered)
    "spent",  # already used once
    "approver_revoked",  # recheck_roles: the approver may no longer decide the request
)
"""Every named reason a receipt is refused for (`ReceiptRefused.reason`, the metric's label)."""


def kid_of(key: OKPKey) -> str:
    """A key's id: its RFC 7638 thumbprint, so the same key has the same kid on every host."""
    return key.thumbprint()


def _read_key(path: Path, where: str) -> OKPKey:
    try:
        key = OKPKey.import_key(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path} ({exc.strerror})") from None
    except (JoseError, ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {path} is not an Ed25519 key in PEM ({exc})") from None
    if key.curve_name != "Ed25519":
        raise ConfigError(f"{where}: {path} holds a {key.curve_name} key; receipts use Ed25519")
    return key


def new_key_pem() -> bytes:
    """A new Ed25519 private key in PEM (PKCS#8), for `[receipts] key_file`."""
    key = OKPKey.generate_key("Ed25519", private=True)
    pem = key.as_pem(private=True)
    return pem if isinstance(pem, bytes) else pem.encode()


@dataclass(frozen=True)
class ReceiptKeys:
    """The key receipts are signed with and every key they are still checked against."""

    signing: OKPKey
    kid: str
    public: KeySet

    @classmethod
    def load(cls, key_file: Path, previous: Iterable[Path] = ()) -> ReceiptKeys:
        """The private key of `key_file`, and the public halves of it and of `previous`
        (keys rotated out, kept until the receipts they signed have expired)."""
        signing = _read_key(key_file, "receipts.key_file")
        kid = kid_of(signing)
        public: list[Key] = [OKPKey.import_key({**signing.as_dict(private=False), "kid": kid})]
        for i, path in enumerate(previous):
            old = _read_key(path, f"receipts.previous_key_files[{i}]")
            public.append(OKPKey.import_key({**old.as_dict(private=False), "kid": kid_of(old)}))
        signing = OKPKey.import_key({**signing.as_dict(private=True), "kid": kid})
        return cls(signing, kid, KeySet(public))

    def jwks(self) -> dict[str, Any]:
        """The JWK Set served at `/.well-known/jwks.json` (public halves only)."""
        keys = []
        for key in self.public.keys:
            data = key.as_dict(private=False)
            keys.append({**data, "kid": key.kid, "alg": ALG, "use": "sig"})
        return {"keys": keys}


def receipt_args(decision: Decision, request_args: dict[str, Any]) -> dict[str, Any]:
    """The args a decision lets run: the modified ones, else the request's own."""
    if decision.outcome is Outcome.modified and decision.args is not None:
        return dict(decision.args)
    return request_args


@dataclass(frozen=True)
class CallFacts:
    """What a receipt binds of the call: fixed when the request was made."""

    request_id: str
    tool_name: str
    tool_call_id: str
    run_id: str | None
    args: dict[str, Any]


class Receipts:
    """Signs receipts for decisions and checks them at execution."""

    def __init__(self, keys: ReceiptKeys, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.keys = keys
        self.ttl_s = int(ttl_s)

    # ---- signing ---------------------------------------------------------------------------

    def claims(
        self,
        call: CallFacts,
        decision: Decision,
        *,
        decided_by: str,
        votes: list[str] | None = None,
        quorum: int = 1,
        now: float | None = None,
    ) -> dict[str, Any]:
        """The claims of the receipt for `decision` on `call` (see `docs/receipts.md`)."""
        iat = int(time.time() if now is None else now)
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "sub": call.request_id,
            "tool_name": call.tool_name,
            "tool_call_id": call.tool_call_id,
            "run_id": call.run_id,
            "args_hash": args_hash(receipt_args(decision, call.args)),
            "outcome": decision.outcome.value,
            "decided_by": decided_by,
            "iat": iat,
            "exp": iat + self.ttl_s,
            "jti": secrets.token_urlsafe(16),
        }
        if decision.rule:
            claims["rule"] = decision.rule
        if votes is not None and quorum > 1:
            claims["quorum"] = {"required": quorum, "votes": votes}
        return claims

    def sign(self, claims: dict[str, Any]) -> str:
        header = {"alg": ALG, "typ": "JWT", "kid": self.keys.kid}
        return jwt.encode(header, claims, self.keys.signing, algorithms=[ALG])

    def stamp(
        self,
        call: CallFacts,
        decision: Decision,
        *,
        decided_by: str,
        votes: list[str] | None = None,
        quorum: int = 1,
    ) -> Decision:
        """`decision` with its receipt (outcomes that let something run), else without one:
        a receipt given by a caller is never kept."""
        if decision.outcome not in RECEIPT_OUTCOMES:
            return (
                decision
                if decision.receipt is None
                else decision.model_copy(update={"receipt": None})
            )
        claims = self.claims(call, decision, decided_by=decided_by, votes=votes, quorum=quorum)
        return decision.model_copy(update={"receipt": self.sign(claims)})

    # ---- checking --------------------------------------------------------------------------

    def verify(
        self,
        token: str | None,
        *,
        request_id: str,
        tool_name: str,
        args: dict[str, Any],
        now: float | None = None,
    ) -> dict[str, Any]:
        """The claims of `token` if it proves that `tool_name` may run with `args` for request
        `request_id` now; else `ReceiptRefused` with the reason. Single use and the approver's
        roles are the caller's to check (they need Redis and the config)."""
        claims = self.decode(token)
        t = time.time() if now is None else now
        if claims.get("iss") != ISSUER:
            raise ReceiptRefused("wrong_issuer", f"issued by {claims.get('iss')!r}")
        exp = claims.get("exp")
        if not isinstance(exp, int | float) or exp + LEEWAY_S < t:
            raise ReceiptRefused("expired", f"the receipt expired at {exp}")
        if claims.get("sub") != request_id:
            raise ReceiptRefused(
                "other_request", f"the receipt is for {claims.get('sub')!r}, not {request_id!r}"
            )
        if claims.get("outcome") not in {o.value for o in RECEIPT_OUTCOMES}:
            raise ReceiptRefused("wrong_outcome", f"outcome {claims.get('outcome')!r}")
        if claims.get("tool_name") != tool_name:
            raise ReceiptRefused(
                "wrong_tool", f"the receipt is for {claims.get('tool_name')!r}, not {tool_name!r}"
            )
        if claims.get("args_hash") != args_hash(args):
            raise ReceiptRefused("args_changed", "the args about to run are not the args approved")
        if not isinstance(claims.get("jti"), str) or not claims["jti"]:
            raise ReceiptRefused("malformed", "the receipt has no jti")
        return claims

    def decode(self, token: str | None) -> dict[str, Any]:
        """The claims of a token signed by one of our keys (signature checked), else refused."""
        if not token or not isinstance(token, str):
            raise ReceiptRefused("missing", "the decision carries no receipt")
        try:
            header = jws.extract_compact(token.encode()).protected
        except (JoseError, ValueError, TypeError, UnicodeError) as exc:
            raise ReceiptRefused("malformed", f"not a compact JWS ({exc})") from None
        if header.get("alg") != ALG:
            raise ReceiptRefused("malformed", f"alg {header.get('alg')!r}, not {ALG}")
        kid = header.get("kid")
        if not any(k.kid == kid for k in self.keys.public.keys):
            raise ReceiptRefused("unknown_key", f"no key {kid!r} in the JWKS")
        try:
            decoded = jwt.decode(token, self.keys.public, algorithms=[ALG])
        except JoseError as exc:
            raise ReceiptRefused("bad_signature", f"{exc.error}") from None
        except (ValueError, TypeError) as exc:
            raise ReceiptRefused("malformed", str(exc)) from None
        return dict(decoded.claims)


@functools.lru_cache(maxsize=8)
def receipts_for(key_file: Path, previous: tuple[Path, ...], ttl_s: float) -> Receipts:
    """The `Receipts` of a config's `[receipts]`, its key files read once per process
    (a rotation is a restart of each role)."""
    return Receipts(ReceiptKeys.load(key_file, previous), ttl_s)


def call_facts(request: Any) -> CallFacts:
    """The facts a receipt binds, from a `Request`."""
    return CallFacts(
        request.id, request.tool_name, request.tool_call_id, request.run_id, dict(request.args)
    )


def spent_ttl(claims: dict[str, Any], now: float | None = None) -> int:
    """How long a spent jti must be remembered: until its receipt could no longer pass."""
    t = time.time() if now is None else now
    return max(int(claims.get("exp", 0) - t) + LEEWAY_S + 60, 60)


def jti_digest(jti: str) -> str:
    """The short, fixed-size name a spent jti is kept under (any text fits a key)."""
    return hashlib.sha256(jti.encode()).hexdigest()[:32]
