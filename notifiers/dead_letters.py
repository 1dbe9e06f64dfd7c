"""What a notifier cannot deliver goes to the dead-letter stream, with its error.

Every way of giving up is here, so each leaves the same trail: the letter (with the fields a
redrive needs), then, for entries, the `failed:entry` counter and the acknowledgement that takes
an unusable entry out of the group (`broker.dropped`).
"""

from __future__ import annotations

import logging

from broker.domain.events import Event
from broker.facade import Broker
from notifiers.tasks import Task

log = logging.getLogger("notifiers")

TRIMMED = "trimmed before delivery"


class DeadLetters:
    def __init__(self, broker: Broker, consumer: str) -> None:
        self.broker = broker
        self.consumer = consumer

    def entry(self, stream: str, entry_id: str, fields: dict[str, str], error: str) -> None:
        """An entry no notifier can handle: dead-letter it with its error, and acknowledge it."""
        log.warning("notifier %s: dead-lettering %s %s: %s", self.consumer, stream, entry_id, error)
        entry = {**fields}
        entry.setdefault("event_id", entry_id)
        self.broker.dead_letter(
            "notifier", error, stream=stream, entry=entry, extra={"consumer": self.consumer}
        )
        self.broker.dropped.drop(stream, [entry_id])

    def trimmed(self, stream: str, ids: list[str], *, ack: bool) -> None:
        """Entries gone from the stream before any notifier delivered them: nothing is left to
        deliver or re-drive, but the loss is recorded where operators look."""
        log.warning("notifier %s: %d entries of %s %s", self.consumer, len(ids), stream, TRIMMED)
        for entry_id in ids:
            self.broker.dead_letter(
                "notifier",
                f"{TRIMMED}: entry {entry_id} of {stream} was gone when it was reclaimed",
                extra={"consumer": self.consumer, "entry_id": entry_id, "from_stream": stream},
            )
        self.broker.dropped.drop(stream, ids, ack=ack)

    def task(self, task: Task, error: str) -> None:
        """One channel's delivery that failed for good (the dispatcher calls this)."""
        event = task.event
        self.broker.dead_letter(
            task.channel,
            error,
            stream=event.stream,
            entry=event.dead_letter_entry(),
            extra={
                "channel": task.channel,
                "request_id": event.request_id,
                "event": event.type,
                "attempts": str(task.attempts),
            },
        )

    def parked(self, channel: str, event: Event, error: str) -> None:
        """A parked delivery whose request can no longer be loaded."""
        self.broker.dead_letter(
            channel,
            error,
            stream=event.stream,
            entry=event.dead_letter_entry(),
            extra={"channel": channel, "request_id": event.request_id},
        )

    def unreadable_parked(self, channel: str, task_id: str, error: str) -> None:
        self.broker.dead_letter(channel, error, extra={"parked": task_id})
