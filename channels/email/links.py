"""Signed, single-use, expiring email links: created by the email notifier, checked by the API.

A link names one request, one recipient, one action, the queue the mail was sent for and how
many times the request had been escalated then: a link from before an escalation no longer
decides the request, even after the request comes back to that queue. All links of one mail share a
nonce, and the nonce is spent on first use.

The signing key must never be kept in Redis: whoever can read Redis could mint links. It comes
from `[email] link_secret` (may be `env:NAME`), else APPROVAL_BROKER_LINK_SECRET; a fleet on the
embedded Redis (`approval-broker up`) instead shares a 0600 file in its data directory, which
`prepare_link_secret` puts into the config when the API or the notifier starts.
"""

from __future__ import annotations

import os
import secrets
import threading
import weakref
from dataclasses import dataclass

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

from broker.domain.config import Config
from broker.domain.errors import BrokerError, ConfigError
from broker.domain.settings import Settings
from broker.facade import Broker, Once
from broker.launcher import embedded_secret
from channels.email.config import email_section

SECRET_ENV = "APPROVAL_BROKER_LINK_SECRET"
SECRET_FILE = "link.secret"  # in the embedded Redis's data directory, 0600
MIN_SECRET_LEN = 32
NO_SECRET = (
    "email is configured but email links have no signing secret: set [email] link_secret "
    f'(e.g. "env:NAME") or {SECRET_ENV} (the same on every api and notifier)'
)

ACTIONS = ("approve", "reject", "answer", "escalate", "view", "approve_run")
# approve_run: approve, and keep the rule "this tool, this run" (broker.judge.rule_decisions)

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
    escalations: int | None = None  # None: made before links were bound to the count


def configured_secret(config: Config) -> str | None:
    """The link-signing secret the config or the environment gives, if any."""
    email = email_section(config)
    given = email.link_secret if email else None
    return given or os.environ.get(SECRET_ENV) or None


def prepare_link_secret(settings: Settings, config: Config) -> None:
    """At the start of a role that signs or checks links: make sure it has the fleet's secret.

    Given one: keep it. On the embedded Redis (the URL is the one its data directory names): the
    secret file there, made on first use. Otherwise (a production fleet) refuse to start,
    since each process would sign with a key the others don't know.
    """
    email = email_section(config)
    if email is None:
        return
    secret = configured_secret(config)
    if secret is None:
        secret = embedded_secret(settings, SECRET_FILE)
    if secret is None:
        raise ConfigError(NO_SECRET)
    if len(secret) < MIN_SECRET_LEN:
        raise ConfigError(f"the email link secret must be at least {MIN_SECRET_LEN} characters")
    email.link_secret = secret


def _serializer(broker: Broker) -> URLSafeTimedSerializer:
    """The broker's signer, made once per Broker from the configured secret (never Redis)."""
    with _lock:
        found = _serializers.get(broker)
    if found is not None:
        return found
    secret = configured_secret(broker.config)
    if secret is None:
        raise ConfigError(NO_SECRET)
    # the key prefix in the salt: a link from another fleet sharing the secret is refused here
    salt = f"approval-broker.email-link:{broker.key_prefix}"
    made = URLSafeTimedSerializer(secret, salt=salt)
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
    escalations: int | None = None,
) -> str:
    """The token for `/v1/email/{token}`; `queue` binds it to the queue the mail is for and
    `escalations` to the request's escalation count when it was made."""
    if action not in ACTIONS:
        raise ValueError(f"unknown link action {action!r}")
    data: dict[str, str | int] = {"r": request_id, "to": recipient, "a": action, "n": nonce}
    if queue is not None:
        data["q"] = queue
    if escalations is not None:
        data["e"] = escalations
    return _serializer(broker).dumps(data)


def read_link(broker: Broker, token: str, max_age_s: float) -> LinkClaims:
    """Check signature, age and that the link is unused; change nothing."""
    try:
        data = _serializer(broker).loads(token, max_age=max_age_s)  # type: ignore[arg-type]  # itsdangerous compares the age with it: a float works, its hint says int
    except SignatureExpired:
        raise LinkError("this link has expired", code="link_expired") from None
    except BadSignature:
        raise LinkError("this link is not valid", code="link_invalid") from None
    if not isinstance(data, dict) or not {"r", "to", "a", "n"} <= data.keys():
        raise LinkError("this link is not valid", code="link_invalid")
    queue, count = data.get("q"), data.get("e")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
        raise LinkError("this link is not valid", code="link_invalid")
    claims = LinkClaims(
        str(data["r"]),
        str(data["to"]),
        str(data["a"]),
        str(data["n"]),
        str(queue) if queue is not None else None,
        count,
    )
    if broker.once.spent(link_once(broker, claims, max_age_s)):
        raise LinkError("this link has already been used", code="link_used")
    return claims


def link_once(broker: Broker, claims: LinkClaims, ttl_s: float) -> Once:
    """The one-time marker of the link's mail, for `Broker.decide(..., once=...)`: it is spent
    in the same atomic step as the decision (in the request's partition on a cluster), so a
    used link can't decide twice and a failed decision doesn't use up the link."""
    return broker.once.marker("email", claims.nonce, int(ttl_s) + 60, request_id=claims.request_id)
