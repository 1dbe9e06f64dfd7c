"""From raw stream entries to tasks: parse each entry, load its request, pick the channels that
want it (less those a done marker says already have it), and hand the tasks to the dispatcher.
An entry no channel wants is acknowledged without loading its request when that is known from
the entry alone: the notifier's channels send nothing (`Sender.sends`: the inbox alone), or none
keeps copies and the entry names the callback of its outcome (decide and sweep write it).

It decides nothing about a request and calls no channel itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.domain.events import (
    ACKED,
    NO_CHANNEL,
    OUTCOME_TYPES,
    REQUESTED,
    Event,
    MalformedEntry,
    parse_entry,
)
from broker.facade import Broker, StoredRequest
from channels import plugin
from channels.copies import copy_holders, keeps_copies
from channels.sender import Sender
from notifiers.dead_letters import DeadLetters
from notifiers.dispatch import Dispatcher
from notifiers.inflight import Inflight
from notifiers.results import DeliveryResult, ResultKind
from notifiers.tasks import InflightEntry, Task

Entry = tuple[str, dict[str, str]]  # (entry id, fields), as the store's reads decode them
ROUTES_KEPT = 1024


class Router:
    def __init__(
        self,
        broker: Broker,
        channels: dict[str, Sender],
        streams: dict[str, str],
        inflight: Inflight,
        dispatcher: Dispatcher,
        report: Callable[[DeliveryResult], None],
        dead_letters: DeadLetters,
    ) -> None:
        self.broker = broker
        self.channels = channels
        self.streams = streams  # stream key -> queue name
        self.inflight = inflight
        self.dispatcher = dispatcher
        self.report = report
        self.dead_letters = dead_letters
        self._routes: dict[tuple[Any, ...], tuple[str, ...]] = {}
        self.quiet = not any(channel.sends for channel in channels.values())
        """No channel sends anything (the inbox alone, no webhook a request's callback could
        name): every entry is acknowledged as read, with no request loaded."""
        self._copies = any(keeps_copies(channel) for channel in channels.values())
        """Some channel keeps copies that later events update: which ones hold a copy of a
        request is in its delivery hash, so every later event of it needs a read."""

    def handle(self, stream: str, entries: list[Entry], *, claimed: bool) -> None:
        """Turn stream entries into in-flight entries and hand their tasks to the dispatcher."""
        queue = self.streams[stream]
        events: list[Event] = []
        for entry_id, fields in entries:
            try:
                events.append(parse_entry(stream, queue, entry_id, fields))
            except MalformedEntry as exc:
                self.dead_letters.entry(stream, entry_id, fields, f"malformed entry: {exc}")
        if not events:
            return
        wanted = []
        for event in events:
            if self._wanted_by_none(event):  # acknowledged as read, with no request loaded
                entry = InflightEntry(event)
                self.inflight.add(entry)
                self.report(DeliveryResult(entry, ResultKind.finished))
            else:
                wanted.append(event)
        if not wanted:
            return
        events = wanted
        requests, problems = self.fetch({e.request_id for e in events})
        # a redelivery needs the done markers; a later event also the copies posted so far
        redo = {
            e.request_id for e in events if claimed or "event_id" in e.fields or e.type != REQUESTED
        }
        done = self.done_fields(redo)
        for event in events:
            request = requests.get(event.request_id)
            if request is None:
                problem = problems.get(event.request_id, "it does not exist")
                self.dead_letters.entry(
                    stream,
                    event.entry_id,
                    event.fields,
                    f"cannot handle request {event.request_id!r}: {problem}",
                )
                continue
            seen = done.get(event.request_id, set())
            routed = self.route(event, request.callback)
            routed += copy_holders(event, seen, self.channels, routed)  # channels.copies
            todo = [c for c in routed if event.done_field(c) not in seen]
            entry = InflightEntry(event, remaining=set(todo), stored=request)
            entry.tasks = [Task(entry, channel) for channel in todo]
            self.inflight.add(entry)
            if not todo:
                self.report(DeliveryResult(entry, ResultKind.finished))
            for task in entry.tasks:
                self.dispatcher.submit(task)

    def _wanted_by_none(self, event: Event) -> bool:
        """Whether no channel wants `event`, known without its request: nothing here sends, or
        nothing here keeps copies and neither the queue's channels nor the callback its entry
        names (an outcome's, written by the step that recorded it) want it."""
        if self.quiet:
            return True
        if self._copies:
            return False
        callback = None
        if event.type in OUTCOME_TYPES:
            if "callback" not in event.fields:  # not named (a rule at create, an older entry)
                return False
            callback = event.fields["callback"] or None
        return not self.route(event, callback)

    def route(self, event: Event, callback: str | None) -> list[str]:
        """The channels of the event's queue that want it, plus the request's `callback`
        webhook for its outcome. An ack only updates posted copies: it is no webhook event
        type, and mail asks for decisions only (`channels.copies`: channels that keep copies).
        Worked out once per kind of event (what `wants` and the rules below look at), as a few
        kinds make up every entry."""
        kind = (
            event.queue,
            event.type,
            event.from_queue,
            event.to_queue,
            callback,
            bool(event.fields.get("ruled_at_create")),
        )
        names = self._routes.get(kind)
        if names is None:
            if len(self._routes) >= ROUTES_KEPT:
                self._routes.clear()
            names = self._routes[kind] = tuple(self._route(event, callback))
        return list(names)

    def _route(self, event: Event, callback: str | None) -> list[str]:
        queue = self.broker.config.queues.get(event.queue)
        names = list(queue.channels) if queue else []
        if callback and event.type in OUTCOME_TYPES:
            names.append(self.broker.config.callback_channel(callback))
        if event.fields.get("ruled_at_create"):  # no person was ever asked: tell no person
            names = [n for n in names if not plugin(n.partition(":")[0]).person_facing]
        out: list[str] = []
        for name in dict.fromkeys(names):
            channel = self.channels.get(name)
            if event.type == ACKED and not keeps_copies(channel):
                continue
            if event.type in NO_CHANNEL:
                continue
            if channel is not None and channel.wants(event):
                out.append(name)
        return out

    def fetch(self, ids: set[str]) -> tuple[dict[str, StoredRequest], dict[str, str]]:
        """The requests the events point at; a request that won't load is reported, not raised
        (`broker.stored_requests`)."""
        return self.broker.stored_requests.fetch(ids)

    def done_fields(self, request_ids: set[str]) -> dict[str, set[str]]:
        """The done markers of each request: which (event, channel) pairs already went out."""
        return self.broker.deliveries.done_fields(request_ids)

    def close(self) -> None:
        """Nothing of its own to release (the broker's client is shared)."""
