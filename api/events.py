"""Server-sent events (`GET /v1/events`): requests created, decided, escalated, timed out.

Reads every configured queue's stream with XREAD (not the notifiers' consumer group: each
listener sees everything). The stream positions are fixed before the `connected` comment is
sent, so anything that happens after a client sees it reaches the client. An escalation is
written to both queues' streams; it is sent once, from the queue it moved to.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.sse import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from api.auth import Caller
from api.errors import ApiError
from api.schemas import ERRORS
from api.state import ApiState, State
from broker.errors import NotFound

router = APIRouter(tags=["events"])

EVENT_TYPES = frozenset(
    {
        "approval.requested",
        "approval.decided",
        "approval.escalated",
        "approval.timed_out",
        "approval.voted",
    }
)
BLOCK_MS = 5000
BATCH = 100


async def _start_positions(state: ApiState, streams: list[str]) -> dict[str, str]:
    """The id of each stream's newest entry now ("0-0" if empty), so nothing later is missed."""
    redis = state.async_redis()
    positions: dict[str, str] = {}
    for stream in streams:
        last = await redis.xrevrange(stream, count=1)
        positions[stream] = last[0][0].decode() if last else "0-0"
    return positions


def _wanted(fields: dict[str, str]) -> bool:
    if fields.get("type") not in EVENT_TYPES or not fields.get("request_id"):
        return False
    if fields["type"] == "approval.escalated":
        return fields.get("queue") == fields.get("to")
    return True


async def event_stream(state: ApiState, queues: list[str]) -> AsyncIterator[ServerSentEvent]:
    redis = state.async_redis()
    positions = await _start_positions(state, [state.broker.keys.stream(q) for q in queues])
    yield ServerSentEvent(comment="connected", retry=2000)
    while True:
        got = await redis.xread(positions, count=BATCH, block=BLOCK_MS)  # type: ignore[arg-type]
        for raw_stream, entries in got or []:
            stream = raw_stream.decode()
            for raw_id, raw_fields in entries:
                positions[stream] = raw_id.decode()
                fields = {k.decode(): v.decode() for k, v in raw_fields.items()}
                if not _wanted(fields):
                    continue
                try:
                    request = await run_in_threadpool(
                        state.broker.get_request, fields["request_id"]
                    )
                except NotFound:
                    continue
                yield ServerSentEvent(
                    event=fields["type"], data=request.public(), id=positions[stream]
                )


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


@router.get(
    "/v1/events",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **ERRORS},
)
async def events(
    principal: Caller,  # first: an anonymous caller gets 401 before any other check
    queues: Annotated[list[str], Depends(selected_queues)],
    state: State,
) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events; `event` is the type, `data` the request as JSON."""
    async for item in event_stream(state, queues):
        yield item
