"""The units of work: an InflightEntry is one stream entry being delivered; a Task is that
entry on one channel.

(Named apart from `broker.runs.agent_jobs`, whose jobs are RQ jobs, and from `broker.domain.events.Event`,
which is the parsed entry itself.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from broker.domain.events import Event
from broker.domain.models import Request
from broker.facade import StoredRequest

T = TypeVar("T")


class InflightEntry:
    """One stream entry in flight; acknowledged when `remaining` is empty.

    Only the committer thread changes `remaining` and `acked`. `tasks` is fixed once the entry
    is routed, so other threads may look at it (to park the slow ones). `stored` is the request
    as the router loaded it (`broker.store.stored_requests`); `request` its model, made on first use.
    """

    __slots__ = (
        "event",
        "stored",
        "_request",
        "remaining",
        "acked",
        "tasks",
        "started",
        "__weakref__",
    )

    def __init__(
        self,
        event: Event,
        request: Request | None = None,
        remaining: set[str] | None = None,
        *,
        stored: StoredRequest | None = None,
    ) -> None:
        self.event = event
        self.stored = stored
        self._request = request
        self.remaining: set[str] = set() if remaining is None else remaining
        self.acked = False
        self.tasks: list[Task] = []
        self.started = time.monotonic()

    @property
    def request(self) -> Request | None:
        if self._request is None and self.stored is not None:
            self._request = self.stored.request
        return self._request

    @property
    def key(self) -> tuple[str, str]:
        """(stream, entry id): how the in-flight table knows this entry."""
        return self.event.stream, self.event.entry_id


class TaskState(StrEnum):
    queued = "queued"  # handed to the channel's pool, not started
    running = "running"  # in `deliver` right now
    waiting = "waiting"  # back-off or pause: due again at `Task.due`
    done = "done"  # delivered, nothing to do, or dead-lettered


@dataclass(eq=False, slots=True)
class Task:
    """One delivery: an entry's event to one channel, with its attempt count and scratch space.

    `parked` is the task's id in the parked store once its delivery was handed on there (see
    notifiers.parking); a local copy that no longer owns the delivery is `released`; `parking`
    is set while a record of it is being written. The dispatcher changes `state`, `parked`,
    `parking` and `released` under its lock only.
    """

    entry: InflightEntry
    channel: str
    attempts: int = 0
    defers: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)
    state: TaskState = TaskState.queued
    due: float = 0.0
    parked: str | None = None
    parking: bool = False
    released: bool = False

    @property
    def event(self) -> Event:
        return self.entry.event

    @property
    def request(self) -> Request:
        assert self.entry.request is not None
        return self.entry.request

    def request_json(self) -> bytes | None:
        """The request as the contract's JSON, from the fields the router read (None: it
        kept only a model, or the hash is an unusual one)."""
        stored = self.entry.stored
        return stored.data_json() if stored is not None else None

    def memo(self, key: str, make: Callable[[], T]) -> T:
        """A value computed once per task and kept across its retries (e.g. a webhook body)."""
        if key not in self.scratch:
            self.scratch[key] = make()
        value: T = self.scratch[key]
        return value
