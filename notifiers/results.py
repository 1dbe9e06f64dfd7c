"""What a delivery attempt reports back to the committer.

(Named apart from `broker.domain.models.Outcome`, which is what a person decided.)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from notifiers.tasks import InflightEntry


class ResultKind(StrEnum):
    delivered = "delivered"  # the channel has it (note goes to the request's history)
    nothing = "nothing"  # the channel needed nothing for this event
    attempt_failed = "attempt_failed"  # one try failed; another is scheduled (counted only)
    dead = "dead"  # given up; the dead letter is already written
    finished = "finished"  # the entry had nothing to deliver at all: just acknowledge it
    handed_on = "handed_on"  # the delivery is durably parked: the entry no longer waits for it


@dataclass(slots=True, eq=False)
class DeliveryResult:
    """`parked` names the parked-store record a task's result settles (None: the entry's own).
    Never changed once made (not `frozen`: its `__init__` would be a third slower)."""

    entry: InflightEntry
    kind: ResultKind
    channel: str | None = None
    channel_kind: str = ""
    note: str | None = None
    parked: str | None = None
