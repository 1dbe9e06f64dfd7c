"""Reading the API's server-sent events in tests."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Event:
    event: str | None = None
    id: str | None = None
    data: Any = None
    comment: str | None = None


def events_of(lines: Iterator[str]) -> Iterator[Event]:
    """Parse an SSE body into events and comments (one Event per blank-line-ended block)."""
    current = Event()
    for line in lines:
        if line == "":
            if current != Event():
                yield current
            current = Event()
        elif line.startswith(":"):
            current.comment = line[1:].strip()
        elif line.startswith("event: "):
            current.event = line.removeprefix("event: ")
        elif line.startswith("id: "):
            current.id = line.removeprefix("id: ")
        elif line.startswith("data: "):
            current.data = json.loads(line.removeprefix("data: "))


def next_event(events: Iterator[Event], within: float = 10.0) -> Event:
    """The next real event, skipping comments (heartbeats); fails after `within` seconds."""
    deadline = time.monotonic() + within
    for item in events:
        if item.event:
            return item
        if time.monotonic() > deadline:
            raise AssertionError(f"no event within {within}s")
    raise AssertionError("the stream ended")
