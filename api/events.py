"""Server-sent events (`GET /v1/events`): requests created, decided, escalated, timed out.

Reads every selected queue's stream with XREAD (not the notifiers' consumer group: each
listener sees everything it may see). The stream positions are fixed before the `connected`
comment is sent, so anything that happens after a client sees it reaches the client. An
escalation is written to both queues' streams; it is sent once, from the queue it moved to.

Why it stays up: each XREAD blocks for well under the Redis client's socket timeout, and a
`: heartbeat` comment goes out when nothing else has for `heartbeat_s`. Each event's `id`
carries every stream's position, so a reconnect with `Last-Event-ID` resumes exactly there
(within the streams' retention). Events go only to principals that may see the request
(api.visibility). Streams per principal are capped per API process; a client that goes away
ends its stream without a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import parse_qsl, urlencode

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.concurrency import run_in_threadpool

from api.auth import Caller
from api.errors import ApiError
from api.schemas import ERRORS
from api.state import ApiState, State
from api.visibility import may_see
from broker.auth import Principal
from broker.errors import ConfigError, NotFound
from broker.models import Request as BrokerRequest

log = logging.getLogger("approval_broker.api.events")
router = APIRouter(tags=["events"])

EVENT_TYPES = frozenset(
    {
        "approval.requested",
        "approval.decided",
        "approval.escalated",
        "approval.timed_out",
        "approval.voted",
        "approval.acked",
    }
)
BATCH = 100
MAX_STREAMS_ENV = "APPROVAL_BROKER_SSE_MAX_STREAMS"
_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


@dataclass(frozen=True)
class EventsSettings:
    """Knobs of the event stream; tests shorten `heartbeat_s`, operators set the cap by env."""

    heartbeat_s: float = 15.0
    block_ms: int = 1000  # one XREAD's wait: far below redis-py's 5 s socket timeout
    max_streams_per_principal: int = 10
    retry_ms: int = 2000  # what EventSource waits before reconnecting

    @classmethod
    def from_env(cls) -> EventsSettings:
        raw = os.environ.get(MAX_STREAMS_ENV, "").strip()
        if not raw:
            return cls()
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError(f"{MAX_STREAMS_ENV} must be a positive integer, not {raw!r}")
        return cls(max_streams_per_principal=int(raw))


@dataclass
class StreamSlots:
    """Open streams per principal name, in this process (one event loop: no lock needed)."""

    limit: int
    open: dict[str, int] = field(default_factory=dict)
    stopping: bool = False  # the server is shutting down: open streams end at their next turn

    def acquire(self, name: str) -> bool:
        if self.open.get(name, 0) >= self.limit:
            return False
        self.open[name] = self.open.get(name, 0) + 1
        return True

    def release(self, name: str) -> None:
        left = self.open.get(name, 0) - 1
        if left > 0:
            self.open[name] = left
        else:
            self.open.pop(name, None)


def stop_event_streams(app: object, stopping: bool = True) -> None:
    """Tell `app`'s open streams to end (api.server calls it when shutdown begins), so they
    don't hold the graceful shutdown until it gives up and cancels them with a traceback.
    `stopping=False` (at startup) lets a restarted server stream again."""
    slots = getattr(getattr(app, "state", None), "event_slots", None)
    if isinstance(slots, StreamSlots):
        slots.stopping = stopping


def encode_position(positions: dict[str, str]) -> str:
    """An event id: each queue's stream position, `default=1733-0&managers=1733-4`."""
    return urlencode(sorted(positions.items()))


def decode_position(last_event_id: str) -> dict[str, str]:
    """The positions a `Last-Event-ID` names; ApiError 400 when it isn't one of our ids."""
    try:
        pairs = parse_qsl(last_event_id, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        pairs = []
    if not pairs or any(not _ENTRY_ID.match(v) for _, v in pairs):
        raise ApiError(400, "bad_last_event_id", "Last-Event-ID is not an id this stream sent")
    return dict(pairs)


async def _newest_ids(state: ApiState, queues: list[str]) -> dict[str, str]:
    """The id of each queue's newest entry now ("0-0" if empty), so nothing later is missed."""
    redis = state.async_redis()
    positions: dict[str, str] = {}
    for queue in queues:
        last = await redis.xrevrange(state.broker.keys.stream(queue), count=1)
        positions[queue] = last[0][0].decode() if last else "0-0"
    return positions


def _wanted(fields: dict[str, str]) -> bool:
    if fields.get("type") not in EVENT_TYPES or not fields.get("request_id"):
        return False
    if fields["type"] == "approval.escalated":
        return fields.get("queue") == fields.get("to")
    return True


async def _as_seen_by(
    state: ApiState, principal: Principal, request: BrokerRequest, event: str
) -> BrokerRequest | None:
    """`request` if `principal` may see it, else None (`created_by` is written by the create
    step itself, so the request as announced already names its creator)."""
    return request if may_see(principal, request, state.config.queue_roles(request.queue)) else None


def _block_ms(state: ApiState, wanted_ms: int) -> int:
    """Block for less than half the client's socket timeout, whatever the setting says."""
    kwargs = state.async_redis().connection_pool.connection_kwargs
    timeout = kwargs.get("socket_timeout")
    if timeout:
        wanted_ms = min(wanted_ms, int(timeout * 500))
    return max(wanted_ms, 1)


async def event_stream(
    state: ApiState,
    principal: Principal,
    queues: list[str],
    settings: EventsSettings,
    resume_from: dict[str, str] | None = None,
    slots: StreamSlots | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """The events `principal` may see, from `resume_from` (else from now), with heartbeats."""
    redis = state.async_redis()
    positions = await _newest_ids(state, queues)
    positions.update({q: v for q, v in (resume_from or {}).items() if q in positions})
    stream_of = {state.broker.keys.stream(q): q for q in queues}
    yield ServerSentEvent(comment="connected", retry=settings.retry_ms)
    last_sent = time.monotonic()
    block = _block_ms(state, settings.block_ms)
    failures = 0
    while not (slots and slots.stopping):
        wait_ms = int(max(0.0, settings.heartbeat_s - (time.monotonic() - last_sent)) * 1000)
        cursor = {stream: positions[q] for stream, q in stream_of.items()}
        try:
            got = await redis.xread(cursor, count=BATCH, block=max(1, min(block, wait_ms)))  # type: ignore[arg-type]
            failures = 0
        except (RedisConnectionError, RedisTimeoutError) as exc:
            failures += 1
            log.warning("event stream: Redis read failed (%s); retrying", type(exc).__name__)
            await asyncio.sleep(min(5.0, 0.1 * 2**failures))
            got = []
        for raw_stream, entries in got or []:
            queue = stream_of[raw_stream.decode()]
            for raw_id, raw_fields in entries:
                positions[queue] = raw_id.decode()
                fields = {k.decode(): v.decode() for k, v in raw_fields.items()}
                if not _wanted(fields):
                    continue
                try:
                    request = await run_in_threadpool(
                        state.broker.get_request, fields["request_id"]
                    )
                except NotFound:
                    continue
                request = await _as_seen_by(state, principal, request, fields["type"])
                if request is None:
                    continue
                yield ServerSentEvent(
                    event=fields["type"], data=request.public(), id=encode_position(positions)
                )
                last_sent = time.monotonic()
        if time.monotonic() - last_sent >= settings.heartbeat_s:
            yield ServerSentEvent(comment="heartbeat")
            last_sent = time.monotonic()


def events_settings(request: Request) -> EventsSettings:
    settings: EventsSettings = request.app.state.events
    return settings


def selected_queues(
    state: State,
    queue: Annotated[
        list[str] | None, Query(description="only these handler queues (default: all)")
    ] = None,
) -> list[str]:
    """Checked before the stream starts, so a bad name is a 422, not a broken stream."""
    known = state.config.queues
    unknown = sorted(set(queue or ()) - set(known))
    if unknown:
        raise ApiError(422, "unknown_queue", f"queue(s) not defined: {', '.join(unknown)}")
    return list(dict.fromkeys(queue)) if queue else list(known)


def resume_position(
    last_event_id: Annotated[
        str | None,
        Header(max_length=4000, description="resume after this event (EventSource sends it)"),
    ] = None,
) -> dict[str, str] | None:
    return decode_position(last_event_id) if last_event_id else None


async def stream_slot(principal: Caller, request: Request) -> AsyncIterator[None]:
    """Hold one of the principal's stream slots for as long as its stream is open; else 429."""
    slots: StreamSlots = request.app.state.event_slots
    if not slots.acquire(principal.name):
        raise ApiError(
            429,
            "too_many_streams",
            f"{principal.name!r} already has {slots.limit} event streams open here",
            headers={"Retry-After": "5"},
        )
    try:
        yield
    finally:
        slots.release(principal.name)


@router.get(
    "/v1/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **ERRORS},
)
async def events(
    principal: Caller,  # first: an anonymous caller gets 401 before any other check
    queues: Annotated[list[str], Depends(selected_queues)],
    resume_from: Annotated[dict[str, str] | None, Depends(resume_position)],
    settings: Annotated[EventsSettings, Depends(events_settings)],
    _slot: Annotated[None, Depends(stream_slot)],
    state: State,
    request: Request,
) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events; `event` is the type, `data` the request as JSON, `id` the position."""
    slots: StreamSlots = request.app.state.event_slots
    async for item in event_stream(state, principal, queues, settings, resume_from, slots):
        yield item
