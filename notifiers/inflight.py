"""The entries one notifier has read and not yet acknowledged, shared by its threads.

The reader adds entries, the committer removes the acknowledged ones, the heartbeat and the
parker look. A condition wakes the reader when room frees up and `stop` when all are done.
Nothing here calls Redis, so holding the lock never waits on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from notifiers.tasks import InflightEntry

Key = tuple[str, str]  # (stream, entry id)


class Inflight:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[Key, InflightEntry] = {}
        self._cv = threading.Condition()

    def __len__(self) -> int:
        with self._cv:
            return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        with self._cv:
            return key in self._entries

    def add(self, entry: InflightEntry) -> None:
        with self._cv:
            self._entries[entry.key] = entry

    def done(self, entries: Iterable[InflightEntry]) -> None:
        """Forget acknowledged entries and wake whoever waits for room.

        Each entry lets go of its tasks (which point back at it): without that cycle, an entry,
        its request and its bodies are freed at once instead of piling up for the cyclic GC,
        whose full collections then stalled a busy notifier for 100-260 ms (the e2e p99).
        The list is replaced, not emptied, so a thread looking at the old one still sees it.
        """
        with self._cv:
            for entry in entries:
                self._entries.pop(entry.key, None)
                entry.tasks = []
            self._cv.notify_all()

    def room(self, wait_s: float = 0.2) -> int:
        """How many more entries may be taken; waits up to `wait_s` while full."""
        with self._cv:
            if len(self._entries) >= self.limit:
                self._cv.wait(wait_s)
            return self.limit - len(self._entries)

    def keys(self) -> list[Key]:
        with self._cv:
            return list(self._entries)

    def older_than(self, age_s: float) -> list[InflightEntry]:
        now = time.monotonic()
        with self._cv:
            return [e for e in self._entries.values() if now - e.started >= age_s]

    def wait_empty(self, deadline: float, give_up: threading.Event) -> None:
        """Return once nothing is in flight, at `deadline`, or when `give_up` is set."""
        with self._cv:
            while self._entries and time.monotonic() < deadline and not give_up.is_set():
                self._cv.wait(0.05)

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()
