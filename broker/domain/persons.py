"""Who a reply's decider is as a person, whatever channel carried the reply.

A vote counts once per person and the one who asked for a call never approves it, so the
judge (`broker.judge.deciding`) must see the same person behind `alice` (a bearer token, a Slack
user, an email address alice has) and `webhook:ops/alice` (an endpoint vouching for alice).
Names are compared after Unicode normalisation (NFKC, format characters such as U+200B
removed, case-folded), so `Carol` and `carol\\u200b` are carol; email addresses are compared
case-insensitively. Pure functions of the config: never touches Redis.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any, Protocol


class HasApprovers(Protocol):
    """What these functions read of the config: its approvers by name.

    A protocol rather than `broker.domain.config.Config`: the config checks its approvers with the
    functions below, so naming its class here would make the two modules import each other."""

    @property
    def approvers(self) -> Mapping[str, Any]: ...


WEBHOOK = "webhook:"
EMAIL = "email:"


def normal_name(text: str) -> str:
    """`text` as names are compared: NFKC, without format characters (Cf), case-folded."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return unicodedata.normalize("NFKC", text.casefold()).strip()


def normal_address(address: str) -> str:
    """An email address as addresses are compared: trimmed, case-insensitive."""
    return address.strip().casefold()


def approver_named(config: HasApprovers, name: str) -> str | None:
    """The configured approver whose name is `name` after normalisation, or None."""
    if name in config.approvers:
        return name
    wanted = normal_name(name)
    return next((a for a in config.approvers if normal_name(a) == wanted), None)


def webhook_person(decided_by: str) -> str | None:
    """The PERSON of `webhook:NAME/PERSON`, else None."""
    if decided_by.startswith(WEBHOOK) and "/" in decided_by:
        return decided_by.split("/", 1)[1]
    return None


def voter_of(config: HasApprovers, decided_by: str) -> str:
    """The person a reply recorded as `decided_by` counts as, for quorum and the creator rule.

    `webhook:NAME/PERSON` is the approver PERSON names (after normalisation), else
    `webhook:NAME/` and the normalised PERSON; `email:ADDRESS` has its address case-folded;
    anything else (an approver's name, the admin, the shell's `--by`) is itself.
    """
    person = webhook_person(decided_by)
    if person is not None:
        endpoint = decided_by.split("/", 1)[0]
        return approver_named(config, person) or f"{endpoint}/{normal_name(person)}"
    if decided_by.startswith(EMAIL):
        return EMAIL + normal_address(decided_by[len(EMAIL) :])
    return decided_by


def same_person(config: HasApprovers, created_by: str, decided_by: str) -> bool:
    """Is the reply recorded as `decided_by` from the one recorded as `created_by`?"""
    if created_by == decided_by or created_by == voter_of(config, decided_by):
        return True
    person = webhook_person(decided_by)
    wanted = normal_name(created_by)
    return wanted == normal_name(decided_by) or (
        person is not None and wanted == normal_name(person)
    )
