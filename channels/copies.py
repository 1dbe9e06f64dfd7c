"""One card kept in sync: every copy of a request a channel posted follows the request's state.

A channel that posts a copy of each request (a Slack message, a Teams, Telegram or Discord
card) implements `CopyUpdater` and records the copy it posted in the request's
delivery hash (`DeliveryState.record_post`, field = the channel's name, value = the platform's
chat/channel id and message id). Then, for every later event of the request (`voted`, `acked`,
`decided`, `escalated`, `timed_out`), whatever channel caused it:

- the channels of the event's queue get the event as always and update their copy;
- the router (`notifiers.router`) also hands the event to every other channel that holds a
  copy of the request (a copy posted in a queue the request was since escalated away from),
  found by `copy_holders`; such a channel updates its copy and never posts a new one.

Updates are ordinary deliveries: retried with the notifier's back-off, `retry_after` honoured,
dead-lettered after the last try, and never in the way of the decision, which is recorded
before the event exists. A channel kind plugs in by implementing the protocol; nothing here
names a platform.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from broker.domain.events import REQUESTED, Event
from broker.domain.models import Request
from broker.facade import PostState


@runtime_checkable
class CopyUpdater(Protocol):
    """A channel that keeps a copy of each request it was sent and brings it up to date.

    `update_copy` rewrites the copy `copy` (as recorded when posted: `channel` is the
    platform's chat or channel id, `ts` its message id) to show `request` as it stands; it
    returns a note for the history and raises `channels.retry.Retry` / `GiveUp` like any
    delivery. It must be idempotent: the same state may be shown twice.
    """

    kind: str
    name: str

    def update_copy(self, copy: PostState, request: Request, what: str) -> str: ...


def keeps_copies(channel: object) -> bool:
    """Whether `channel` posts copies that later events update (and so wants `acked`)."""
    return isinstance(channel, CopyUpdater)


def copy_holders(
    event: Event, fields: Iterable[str], channels: Mapping[str, object], routed: Iterable[str]
) -> list[str]:
    """The channels outside `routed` that recorded a copy of the event's request (their names
    are fields of its delivery hash) and should update it for `event`."""
    if event.type == REQUESTED:
        return []
    skip = set(routed)
    return [
        name
        for name in fields
        if name not in skip and not name.startswith("done:") and keeps_copies(channels.get(name))
    ]


def claim_stale_s(claim_idle_s: float, timeout_s: float) -> float:
    """How long a posting claim is honoured: longer than the worst single postMessage call
    (connect, send and read may each take the timeout), so a slow call is never overtaken."""
    return max(claim_idle_s, 3 * timeout_s + 5)
