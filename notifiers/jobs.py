"""The units of work: a Job is one stream entry; a Task is that entry on one channel."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from broker.models import Request
from notifiers.events import Event

T = TypeVar("T")


@dataclass(eq=False)
class Job:
    """One stream entry in flight; acknowledged when `remaining` is empty.

    Only the committer thread changes `remaining` and `acked`. `tasks` is fixed once the job is
    routed, so other threads may look at it (to park the slow ones).
    """

    event: Event
    request: Request | None
    remaining: set[str] = field(default_factory=set)
    acked: bool = False
    tasks: list[Task] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


class State(StrEnum):
    queued = "queued"  # handed to the channel's pool, not started
    running = "running"  # in `deliver` right now
    waiting = "waiting"  # back-off or pause: due again at `Task.due`
    done = "done"  # delivered, nothing to do, or dead-lettered


@dataclass(eq=False)
class Task:
    """One delivery: a job's event to one channel, with its attempt count and scratch space.

    `parked` is the task's id in the parked store once its delivery was handed on there (see
    notifiers.parking); a local copy that no longer owns the delivery is `released`. The
    dispatcher changes `state`, `parked` and `released` under its lock only.
    """

    job: Job
    channel: str
    attempts: int = 0
    defers: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)
    state: State = State.queued
    due: float = 0.0
    parked: str | None = None
    released: bool = False

    @property
    def event(self) -> Event:
        return self.job.event

    @property
    def request(self) -> Request:
        assert self.job.request is not None
        return self.job.request

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """A value computed once per task and kept across its retries (e.g. a webhook body)."""
        if key not in self.scratch:
            self.scratch[key] = make()
        value: T = self.scratch[key]
        return value
