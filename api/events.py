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
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from redis.exceptions import ClusterError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.concurrency import run_in_threadpool

from api.auth import Caller
from api.errors import ApiError
from api.event_reads import (
    PartitionReader,
    SingleReader,
    decode_position,
    encode_position,
)
from api.follow import Waiter, waiter_for
from api.schemas import ERRORS
from api.state import ApiState, State
from api.visibility import may_see
from broker.domain.errors import ConfigError, NotFound
from broker.domain.models import Request as BrokerRequest
from broker.domain.principals import Principal

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
        "approval.receipt_refused",
        "approval.shadow_rule",
    }
)
MAX_STREAMS_ENV = "APPROVAL_BROKER_SSE_MAX_STREAMS"
__all__ = ["decode_position", "encode_position", "event_stream", "router"]


@dataclass(frozen=True)
class EventsSettings:
    """Knobs of the event stream; tests shorten `heartbeat_s`, operators set the cap by env."""

    heartbeat_s: float = 15.0
    block_ms: int = 1000  # one XREAD's wait: below half the API client's 3 s socket timeout
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
    exiting: Callable[[], bool] = field(default=lambda: False)
    """True once the server is shutting down: open streams end at their next turn."""

    @property
    def stopping(self) -> bool:
        return self.exiting()

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


class _Exiting(Protocol):
    should_exit: bool


def end_event_streams_with(app: object, server: _Exiting) -> None:
    """End `app`'s open streams once `server` (a `uvicorn.Server`) starts shutting down, so
    they don't hold the graceful shutdown until it gives up and cancels them with a traceback.
    A stream looks at each turn (at most `block_ms` apart, a second by default)."""
    slots = getattr(getattr(app, "state", None), "event_slots", None)
    if isinstance(slots, StreamSlots):
        slots.exiting = lambda: server.should_exit


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
    timeout = state.reads().socket_timeout()
    if timeout:
        wanted_ms = min(wanted_ms, int(timeout * 500))
    return max(wanted_ms, 1)


def _reader(
    state: ApiState, queues: list[str], waiter: Waiter | None
) -> SingleReader | PartitionReader:
    reads = state.reads()
    if reads.partitions > 1:
        assert waiter is not None, "a cluster's event stream reads through the process's waiter"
        return PartitionReader(reads, queues, waiter)
    return SingleReader(reads, queues)


async def event_stream(
    state: ApiState,
    principal: Principal,
    queues: list[str],
    settings: EventsSettings,
    resume_from: dict[str, str] | None = None,
    slots: StreamSlots | None = None,
    waiter: Waiter | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """The events `principal` may see, from `resume_from` (else from now), with heartbeats."""
    reader = _reader(state, queues, waiter)
    try:
        await reader.start(resume_from)
        yield ServerSentEvent(comment="connected", retry=settings.retry_ms)
        last_sent = time.monotonic()
        block = _block_ms(state, settings.block_ms)
        failures = 0
        while not (slots and slots.stopping):
            wait_ms = int(max(0.0, settings.heartbeat_s - (time.monotonic() - last_sent)) * 1000)
            try:
                got = await reader.next(max(1, min(block, wait_ms)))
                failures = 0
            except (
                RedisConnectionError,
                RedisTimeoutError,
                ClusterError,
                RedisClusterException,
            ) as exc:
                failures += 1
                log.warning("event stream: Redis read failed (%s); retrying", type(exc).__name__)
                await asyncio.sleep(min(5.0, 0.1 * 2**failures))
                got = []
            for stream, entries in got:
                for raw_id, raw_fields in entries:
                    reader.positions[stream] = raw_id.decode()
                    fields = {k.decode(): v.decode() for k, v in raw_fields.items()}
                    if not _wanted(fields):
                        continue
                    try:
                        request = await run_in_threadpool(
                            state.broker.get_request, fields["request_id"]
                        )
                    except NotFound:
                        continue
                    seen = await _as_seen_by(state, principal, request, fields["type"])
                    if seen is None:
                        continue
                    yield ServerSentEvent(
                        event=fields["type"], data=seen.public(), id=reader.event_id()
                    )
                    last_sent = time.monotonic()
            if time.monotonic() - last_sent >= settings.heartbeat_s:
                yield ServerSentEvent(comment="heartbeat")
                last_sent = time.monotonic()
    finally:
        reader.close()


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
    state: State,
    last_event_id: Annotated[
        str | None,
        Header(max_length=8000, description="resume after this event (EventSource sends it)"),
    ] = None,
) -> dict[str, str] | None:
    return decode_position(last_event_id, state.broker.partitions) if last_event_id else None


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
    waiter = waiter_for(request, state) if state.broker.partitions > 1 else None
    stream = event_stream(state, principal, queues, settings, resume_from, slots, waiter)
    async for item in stream:
        yield item
