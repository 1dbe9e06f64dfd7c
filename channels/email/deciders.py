"""Who an email address decides as, and through which email lists.

The notifier (which mails decision links only to those who may use them) and the API (which
checks a link when it is used) must answer this the same way, so both ask here; whether that
principal may then decide a request is `broker.judge.deciding`'s call. Never sends or reads mail.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.domain.config import Config
from broker.domain.persons import normal_address
from broker.domain.principals import Principal
from channels.email.config import EmailConfig, email_section


@dataclass(frozen=True)
class EmailDecider:
    """An address as a decider: its principal, the lists it decides through (`email:NAME`),
    and every list that holds it (whether or not it may decide through them)."""

    principal: Principal
    via: list[str]
    held: list[str]
    mapped: bool  # an approver has this address


def email_approver(config: Config, address: str) -> Principal | None:
    """The approver whose `email` this is (case-insensitive), or None."""
    wanted = normal_address(address)
    for name, approver in config.approvers.items():
        email = approver.identity("email")
        if email and normal_address(email) == wanted:
            return Principal(name, frozenset(approver.roles))
    return None


def recipient_channels(email: EmailConfig, recipient: str, mapped: bool) -> list[str]:
    """The email lists (`email:NAME`) the recipient may decide through: every list that holds
    the address, and for an address no approver has, only lists with `unmapped_may_decide`."""
    wanted = normal_address(recipient)
    return [
        f"email:{name}"
        for name, found in email.lists.items()
        if any(normal_address(to) == wanted for to in found.to)
        and (mapped or found.unmapped_may_decide)
    ]


def email_decider(config: Config, recipient: str) -> EmailDecider:
    """`recipient` as a decider; an address no approver has is `email:ADDRESS` with no roles,
    the address case-folded: `EXT@x` and `ext@x` are one person, with one vote."""
    approver = email_approver(config, recipient)
    email = email_section(config)
    via = recipient_channels(email, recipient, mapped=approver is not None) if email else []
    held = recipient_channels(email, recipient, mapped=True) if email else []
    principal = approver or Principal(f"email:{normal_address(recipient)}", frozenset())
    return EmailDecider(principal, via, held, mapped=approver is not None)
