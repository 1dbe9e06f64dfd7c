"""Signed, single-use, expiring email links: created by the email notifier, checked by the API.

A link names one request, one recipient, one action and the queue the mail was sent for (so a
link from before an escalation no longer decides the request). The signing key is a random
secret created once per Redis (so every process of a fleet agrees on it without
configuration), read once per Broker. All links of one mail share a nonce, and the nonce is
spent on first use.
"""

from __future__ import annotations

import secrets
import threading
import weakref
from dataclasses import dataclass

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

from broker.client import Broker
from broker.errors import BrokerError

ACTIONS = ("approve", "reject", "answer", "escalate", "view")

_serializers: weakref.WeakKeyDictionary[Broker, URLSafeTimedSerializer] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


class LinkError(BrokerError):
    """A link that is forged, expired or already used; `code` says which."""

    code = "bad_link"


@dataclass(frozen=True)
class LinkClaims:
    request_id: str
    recipient: str
    action: str
    nonce: str
    queue: str | None = None  # None: a link made before links were bound to a queue


def _serializer(broker: Broker) -> URLSafeTimedSerializer:
    """The broker's signer; the shared secret costs two round trips once, then none."""
    with _lock:
        found = _serializers.get(broker)
    if found is not None:
        return found
    key = broker.keys.secret
    broker.redis.set(key, secrets.token_hex(32), nx=True)
    secret = broker.redis.get(key)
    assert secret is not None
    made = URLSafeTimedSerializer(secret.decode(), salt="approval-broker.email-link")
    with _lock:
        return _serializers.setdefault(broker, made)


def new_nonce() -> str:
    return secrets.token_urlsafe(12)


def sign_link(
    broker: Broker,
    request_id: str,
    recipient: str,
    action: str,
    nonce: str,
    *,
    queue: str | None = None,
) -> str:
    """The token for `/v1/email/{token}`; `queue` binds it to the queue the mail is for."""
    if action not in ACTIONS:
        raise ValueError(f"unknown link action {action!r}")
    data = {"r": request_id, "to": recipient, "a": action, "n": nonce}
    if queue is not None:
        data["q"] = queue
    return _serializer(broker).dumps(data)


def read_link(broker: Broker, token: str, max_age_s: float) -> LinkClaims:
    """Check signature, age and that the link is unused; change nothing."""
    try:
        data = _serializer(broker).loads(token, max_age=max_age_s)
    except SignatureExpired:
        raise LinkError("this link has expired", code="link_expired") from None
    except BadSignature:
        raise LinkError("this link is not valid", code="link_invalid") from None
    if not isinstance(data, dict) or not {"r", "to", "a", "n"} <= data.keys():
        raise LinkError("this link is not valid", code="link_invalid")
    queue = data.get("q")
    claims = LinkClaims(
        str(data["r"]),
        str(data["to"]),
        str(data["a"]),
        str(data["n"]),
        str(queue) if queue is not None else None,
    )
    if broker.redis.exists(broker.keys.seen("email", claims.nonce)):
        raise LinkError("this link has already been used", code="link_used")
    return claims


def link_once(broker: Broker, claims: LinkClaims, ttl_s: float) -> tuple[str, int]:
    """The one-time marker of the link's mail, for `Broker.decide(..., once=...)`: it is spent
    in the same atomic step as the decision, so a used link can't decide twice and a failed
    decision doesn't use up the link."""
    return broker.keys.seen("email", claims.nonce), int(ttl_s) + 60
