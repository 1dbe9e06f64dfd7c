"""What a delivery attempt reports back to the committer."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from notifiers.jobs import Job


class Kind(StrEnum):
    delivered = "delivered"  # the channel has it (note goes to the request's history)
    nothing = "nothing"  # the channel needed nothing for this event
    attempt_failed = "attempt_failed"  # one try failed; another is scheduled (counted only)
    dead = "dead"  # given up; the dead letter is already written
    finished = "finished"  # the job had nothing to deliver at all: just acknowledge it
    handed_on = "handed_on"  # the delivery is durably parked: the entry no longer waits for it


@dataclass(frozen=True)
class Outcome:
    """`parked` names the parked-store record a task's result settles (None: the job's own)."""

    job: Job
    kind: Kind
    channel: str | None = None
    channel_kind: str = ""
    note: str | None = None
    parked: str | None = None
