"""Stream entries as events: parsing, checking, and the identities that stay stable on retries."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime

from broker.domain.models import from_timestamp

REQUESTED = "approval.requested"
DECIDED = "approval.decided"
ESCALATED = "approval.escalated"
TIMED_OUT = "approval.timed_out"
VOTED = "approval.voted"  # a partial approval (quorum): Slack updates, webhooks hear, mail doesn't
ACKED = "approval.acked"  # "I'm on it": Slack updates; not mailed, not sent to webhooks
RECEIPT_REFUSED = "approval.receipt_refused"  # a tool did not run: SSE and metrics, no channel
SHADOW_RULE = "approval.shadow_rule"  # a shadow rule would have decided: SSE, no channel
EVENT_TYPES = (REQUESTED, DECIDED, ESCALATED, TIMED_OUT, VOTED, ACKED, RECEIPT_REFUSED, SHADOW_RULE)
NO_CHANNEL = frozenset({RECEIPT_REFUSED, SHADOW_RULE})
"""Event types for the event stream's readers only: no channel is sent them."""
OUTCOME_TYPES = (DECIDED, TIMED_OUT)  # what a request's callback webhook is told

_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


class MalformedEntry(ValueError):
    """A stream entry no notifier can ever handle; it goes to the dead-letter stream."""


@dataclass(frozen=True)
class Event:
    """One stream entry: a pointer to a request and what happened to it."""

    stream: str
    queue: str
    entry_id: str
    event_id: str  # the id of the entry as first written; survives a redrive
    type: str
    request_id: str
    fields: dict[str, str]
    from_queue: str | None = None
    to_queue: str | None = None

    @property
    def at(self) -> datetime:
        """When the event happened: the millisecond part of its original stream id."""
        return from_timestamp(int(self.event_id.split("-", 1)[0]) / 1000)

    @property
    def moved_away(self) -> bool:
        """An escalation as seen by the queue the request left (update, never post fresh)."""
        return self.type == ESCALATED and self.from_queue == self.queue != self.to_queue

    def webhook_id(self, channel: str) -> str:
        """Stable Standard Webhooks message id for this event at one endpoint."""
        raw = f"{self.request_id}\n{self.event_id}\n{self.queue}\n{channel}".encode()
        return "msg_" + hashlib.sha256(raw).hexdigest()[:32]

    def done_field(self, channel: str, part: str | None = None) -> str:
        """Delivery-hash field saying this event reached `channel` (or one recipient of it)."""
        base = f"done:{self.event_id}:{self.queue}:{channel}"
        return f"{base}:{part}" if part else base

    def dead_letter_entry(self) -> dict[str, str]:
        """The fields to keep in a dead letter so a redrive reproduces this event exactly."""
        return {**self.fields, "event_id": self.event_id}


def parse_entry(stream: str, queue: str, entry_id: str, fields: dict[str, str]) -> Event:
    """Check an entry's shape; raise MalformedEntry saying what is wrong."""
    kind = fields.get("type")
    if kind not in EVENT_TYPES:
        raise MalformedEntry(f"unknown event type {kind!r} (expected one of {EVENT_TYPES})")
    request_id = fields.get("request_id", "")
    if not request_id or len(request_id) > 200:
        raise MalformedEntry("entry has no usable request_id")
    event_id = fields.get("event_id") or entry_id
    if not _ENTRY_ID.match(event_id):
        raise MalformedEntry(f"event_id {event_id!r} is not a stream id")
    from_queue, to_queue = fields.get("from") or None, fields.get("to") or None
    if kind == ESCALATED and not (from_queue and to_queue):
        raise MalformedEntry("an escalated event needs 'from' and 'to'")
    return Event(
        stream=stream,
        queue=queue,
        entry_id=entry_id,
        event_id=event_id,
        type=kind,
        request_id=request_id,
        fields=fields,
        from_queue=from_queue,
        to_queue=to_queue,
    )
