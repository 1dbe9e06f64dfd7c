"""Who a reply's decider is as a person, whatever channel carried the reply.

A vote counts once per person and the one who asked for a call never approves it, so the
judge (`broker.judge.deciding`) must see the same person behind `alice` (a bearer token, a Slack
user, an email address alice has) and `webhook:ops/alice` (an endpoint vouching for alice).
An endpoint vouches only for configured approvers: named by their name, their email address
or their Slack, Teams, Telegram or Discord user id. Any other person it names is the endpoint
itself (`webhook:ops`), so one endpoint is at most one vote of its own, however many names it
makes up. Names are compared after Unicode normalisation (NFKC, format characters such as
U+200B removed, case-folded), so `Carol` and `carol\\u200b` are carol; email addresses and Teams
ids are compared case-insensitively. Pure functions of the config: never touches Redis.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any, Protocol

from broker.domain import channel_kinds


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


def _ids_of(approver: Any) -> dict[str, str]:
    """An approver's identities other than its name, by channel kind (`{"slack": "u1"}`), as
    compared: trimmed and case-folded (addresses, GUIDs and platform ids alike)."""
    fields = channel_kinds.approver_fields()
    ids: dict[str, str] = {}
    for field, value in approver.identities.items():
        owner = fields.get(field)
        if owner is not None:
            ids[owner.kind] = value.strip().casefold()
    return ids


def approver_known_as(config: HasApprovers, text: str) -> str | None:
    """The configured approver `text` names: by name (after normalisation), email address
    (case-insensitive, `email:` in front or not), or Slack, Teams, Telegram or Discord user id
    (`KIND:ID` or the bare id). None when no approver is meant, or when the bare id is more
    than one approver's (a Telegram id equal to another's Discord id): no guessing."""
    named = approver_named(config, text)
    if named is not None:
        return named
    spelled = text.strip()
    kind, sep, rest = spelled.partition(":")
    kinds = {owner.kind for owner in channel_kinds.approver_fields().values()}
    wanted = {kind.casefold(): rest.strip()} if sep and kind.casefold() in kinds else {}
    if not wanted:  # a bare value: any kind of id, or an address
        wanted = dict.fromkeys(kinds, spelled)
    found = set()
    for name, approver in config.approvers.items():
        for kind, value in _ids_of(approver).items():
            given = wanted.get(kind)
            if given is None:
                continue
            if given.strip().casefold() == value:
                found.add(name)
    return found.pop() if len(found) == 1 else None


def webhook_person(decided_by: str) -> str | None:
    """The PERSON of `webhook:NAME/PERSON`, else None."""
    if decided_by.startswith(WEBHOOK) and "/" in decided_by:
        return decided_by.split("/", 1)[1]
    return None


def voter_of(config: HasApprovers, decided_by: str) -> str:
    """The person a reply recorded as `decided_by` counts as, for quorum and the creator rule.

    `webhook:NAME/PERSON` is the approver PERSON names (`approver_known_as`), else the
    endpoint itself, `webhook:NAME`: the endpoint vouches for configured people only, and is
    one person of its own for everyone else (a made-up name, `webhook:NAME` again, another
    endpoint's name). `email:ADDRESS` is the approver with that address, else the address
    case-folded; anything else (an approver's name, the admin, the shell's `--by`) is itself.
    """
    person = webhook_person(decided_by)
    if person is not None:
        return approver_known_as(config, person) or decided_by.split("/", 1)[0]
    if decided_by.startswith(EMAIL):
        address = normal_address(decided_by[len(EMAIL) :])
        return approver_known_as(config, EMAIL + address) or EMAIL + address
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
