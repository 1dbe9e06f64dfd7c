"""The units of work: a Job is one stream entry; a Task is that entry on one channel."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from broker.models import Request
from notifiers.events import Event


@dataclass(eq=False)
class Job:
    """One stream entry in flight; acknowledged when `remaining` is empty.

    Only the committer thread changes `remaining` and `acked`.
    """

    event: Event
    request: Request | None
    remaining: set[str] = field(default_factory=set)
    acked: bool = False


@dataclass(eq=False)
class Task:
    """One delivery: a job's event to one channel, with its attempt count and scratch space."""

    job: Job
    channel: str
    attempts: int = 0
    defers: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)

    @property
    def event(self) -> Event:
        return self.job.event

    @property
    def request(self) -> Request:
        assert self.job.request is not None
        return self.job.request
