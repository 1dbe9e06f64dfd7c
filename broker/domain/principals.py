"""Principals and tokens: who is asking, and may they decide this request.

Tokens are never stored: the config holds their sha256, compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field

from broker.domain.config import Config
from broker.domain.errors import Forbidden
from broker.domain.models import Request

ADMIN = "admin"
EVERY_ROLE = "*"
REQUESTER = "requester"
AUDITOR = "auditor"
NON_DECIDING = frozenset({REQUESTER, AUDITOR})  # a principal with only these roles decides nothing


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh bearer token (256 bits, URL-safe)."""
    return "ab_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Principal:
    """An approver or service, as the config names it; `roles` decide what it may do."""

    name: str
    roles: frozenset[str] = field(default_factory=frozenset)

    def has_role(self, role: str) -> bool:
        return EVERY_ROLE in self.roles or role in self.roles

    def decides_anything(self) -> bool:
        """False for a service that asks (`requester`) or a reader (`auditor`, which "sees
        everything, decides nothing"), or both: such a principal never decides or acks."""
        if EVERY_ROLE in self.roles:
            return True
        return not (self.roles and self.roles <= NON_DECIDING)

    def may_decide(self, request: Request, queue_roles: Collection[str] = ()) -> bool:
        """Roles only (the decision service also checks the channel a reply came through).

        A decider needs one of `queue_roles` (the request's queue's minimum roles) when there
        are any, AND one of the request's `allowed_roles` when there are any; empty
        `allowed_roles` means any approver. A principal whose only role is `requester` is a
        service that asks, not an approver: it can never decide, so an agent's token can't
        approve its own tool calls; nor can one whose roles are only `requester`/`auditor`.
        """
        return self.may_decide_with(request.allowed_roles, queue_roles)

    def may_decide_with(
        self, allowed_roles: Collection[str], queue_roles: Collection[str] = ()
    ) -> bool:
        """`may_decide` for a request with these `allowed_roles` (one that may not exist yet)."""
        if EVERY_ROLE in self.roles:
            return True
        if not self.decides_anything():
            return False
        if queue_roles and not self.roles.intersection(queue_roles):
            return False
        if not allowed_roles:
            return True
        return bool(self.roles.intersection(allowed_roles))


def operator(name: str) -> Principal:
    """Someone at a shell with the broker's Redis in hand (`approval-broker decide --by NAME`):
    they could write Redis directly, so no role or channel check would hold them back."""
    return Principal(name, frozenset({EVERY_ROLE}))


def authenticate(
    config: Config, token: str | None, admin_token: str | None = None
) -> Principal | None:
    """The principal a bearer token belongs to, or None. Every candidate is compared."""
    if not token:
        return None
    digest = hash_token(token)
    found: Principal | None = None
    if admin_token and hmac.compare_digest(digest, hash_token(admin_token)):
        found = Principal(ADMIN, frozenset({EVERY_ROLE}))
    for name, approver in config.approvers.items():
        if approver.token_sha256 and hmac.compare_digest(digest, approver.token_sha256):
            found = found or Principal(name, frozenset(approver.roles))
    return found


def deciders_in(config: Config, queue: str) -> list[Principal]:
    """The principals the config names that could reply in `queue`: every approver (a token,
    a chat user, an address), and each channel of `queue` that is a principal of its own and
    decides (a webhook endpoint that is not notify-only). Roles are not looked at here:
    `may_decide_with` does that."""
    listed = config.queues[queue].channels if queue in config.queues else []
    found = [Principal(name, frozenset(a.roles)) for name, a in config.approvers.items()]
    for channel in listed:
        roles = config.channel_roles(channel)
        if roles and config.decides_through(channel):
            found.append(Principal(channel, frozenset(roles)))
    return found


def nobody_decides(config: Config, queue: str, allowed_roles: Collection[str]) -> bool:
    """Would a request in `queue` with these `allowed_roles` wait for the admin alone? True
    when no configured principal holds one of them together with one of the queue's roles and
    an approver's role (`requester` and `auditor` decide nothing)."""
    if not allowed_roles:
        return False
    queue_roles = config.queue_roles(queue)
    return not any(
        p.may_decide_with(allowed_roles, queue_roles) for p in deciders_in(config, queue)
    )


def principal_named(config: Config, name: str) -> Principal:
    approver = config.approvers.get(name)
    return Principal(name, frozenset(approver.roles if approver else ()))


class NotAnApprover(Forbidden):
    """An account the config names as no approver's. Its text names only the account the
    clicker sent (`channels.refusals` shows it as is), never a request, queue or channel."""


def approver_with(config: Config, field: str, value: object, *, who: str) -> Principal:
    """The approver whose approver field `field` (`slack_user_id`, `email`...) is `value`.

    Anyone else on the platform (a guest, another tenant's user, a Slack Connect member) is
    refused: an account is an approver only once the config names it, and then it is that
    approver on every channel (`broker.domain.persons`). Values are compared trimmed and
    without case (Entra ID object ids are GUIDs; platform ids never differ by case alone).
    `who` says who asked, for the refusal ("Slack user U1").
    """
    wanted = str(value or "").strip().casefold()
    if wanted:
        for name, approver in config.approvers.items():
            known = approver.identity(field)
            if known is not None and known.strip().casefold() == wanted:
                return Principal(name, frozenset(approver.roles))
    raise NotAnApprover(f"{who} is not an approver here (no approver's {field} matches)")
