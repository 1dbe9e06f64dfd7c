"""Who made a change, as the audit trail records it: `actor` and `actor_kind`.

`decided_by` is already the broker's name for who decided (`alice`, `rule:ID`,
`webhook:NAME/PERSON`, `email:ADDRESS`, `sweeper`); the kind is read from its form, once here.
"""

from __future__ import annotations

from typing import Literal

ActorKind = Literal["person", "rule", "webhook", "system"]
SYSTEM_ACTORS = frozenset({"sweeper", "system", "broker", "config"})


def actor_kind(actor: str | None) -> ActorKind:
    """`rule:ID` a rule, `webhook:NAME[/PERSON]` a webhook, the broker's own roles (and nobody)
    the system; anyone else (an approver, an email address, the admin) a person."""
    if not actor or actor in SYSTEM_ACTORS:
        return "system"
    if actor.startswith("rule:"):
        return "rule"
    if actor.startswith("webhook:"):
        return "webhook"
    return "person"


def actor_args(actor: str | None) -> dict[str, str]:
    """The `actor` and `actor_kind` values a Lua step's argument carries (lib.lua actor_of())."""
    return {"actor": actor or "", "actor_kind": actor_kind(actor)}
