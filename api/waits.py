"""Long-polls: answer when requests are no longer pending, or after a timeout (at most 60 s).

`GET /v1/requests/{id}?wait=S` (the `long_poll` dependency of that route) and
`POST /v1/requests/wait` for several. Nothing polls Redis: every outcome is announced on the
request's queue stream by the same Lua step that records it, and one reader task per API process
and event loop follows those streams (XREAD BLOCK) and wakes the handlers waiting on that
request id. The reader fixes its stream positions *before* a handler first reads the request,
so an outcome recorded after that read is always seen; it stops when nobody waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from redis import asyncio as aredis
from starlette.concurrency import run_in_threadpool

from api.auth import Caller
from api.schemas import ERRORS
from api.state import ApiState, State
from api.visibility import seer
from broker.errors import NotFound
from broker.models import Request

log = logging.getLogger("approval_broker.api.waits")

router = APIRouter(prefix="/v1/requests", tags=["requests"])

MAX_WAIT_S = 60.0
BLOCK_MS = 1000
"""XREAD BLOCK per call: short, well below any socket timeout, so a dead connection shows."""
BATCH = 500
_ID = r"^[A-Za-z0-9_.-]+$"
_CONNECTION_KWARGS = ("host", "port", "db", "username", "password", "path")

Fetch = Callable[[list[str]], Awaitable[list[Request]]]


class Waiter:
    """The one stream reader of an API process (per event loop) and who waits on which id."""

    def __init__(self, redis: aredis.Redis, streams: Sequence[str]) -> None:
        self.redis = redis
        self.streams = list(streams)
        self.loop = asyncio.get_running_loop()
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._positions: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @contextlib.contextmanager
    def _watching(self, ids: Sequence[str]) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        for rid in ids:
            self._watchers.setdefault(rid, set()).add(event)
        try:
            yield event
        finally:
            for rid in ids:
                events = self._watchers.get(rid)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._watchers[rid]
            if not self._watchers and self._task is not None:
                self._task.cancel()  # nobody waits: no reader left blocking on Redis
                self._task = None

    async def _ensure_reader(self) -> None:
        """Start the reader if none runs; returns once its positions are fixed."""
        if self._task is not None and not self._task.done():
            return
        async with self._lock:
            if self._task is not None and not self._task.done():
                return
            pipe = self.redis.pipeline(transaction=False)
            for stream in self.streams:
                pipe.xrevrange(stream, count=1)
            newest = await pipe.execute()
            self._positions = {
                stream: rows[0][0].decode() if rows else "0-0"
                for stream, rows in zip(self.streams, newest, strict=True)
            }
            self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while self._watchers:
                got = await self.redis.xread(self._positions, count=BATCH, block=BLOCK_MS)  # type: ignore[arg-type]
                for raw_stream, entries in got or []:
                    stream = raw_stream.decode()
                    for raw_id, fields in entries:
                        self._positions[stream] = raw_id.decode()
                        rid = fields.get(b"request_id")
                        for event in self._watchers.get(rid.decode() if rid else "", ()):
                            event.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis went away: wake everyone to re-read (and restart us)
            log.warning("long-poll reader stopped: %s", type(exc).__name__)
            for events in self._watchers.values():
                for event in events:
                    event.set()

    async def until(
        self, ids: Sequence[str], timeout: float, *, every: bool, fetch: Fetch
    ) -> list[Request]:
        """The requests as soon as all (`every`) or one of them are no longer pending, or as
        they stand after `timeout` seconds. An id that does not exist counts as done."""
        ids = list(dict.fromkeys(ids))
        deadline = self.loop.time() + timeout
        with self._watching(ids) as event:
            while True:
                await self._ensure_reader()
                event.clear()  # before reading: a wake-up during the read is not lost
                requests = await fetch(ids)
                pending = sum(1 for r in requests if r.is_pending)  # a missing id is done
                if pending == 0 or (not every and pending < len(ids)):
                    return requests
                left = deadline - self.loop.time()
                if left <= 0:
                    return requests
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)


def _async_redis(state: ApiState) -> aredis.Redis:
    """An asyncio client of the broker's Redis for this loop (a client is bound to its loop)."""
    if state.settings.redis_url:
        return aredis.Redis.from_url(state.settings.redis_url)
    kwargs = state.broker.redis.connection_pool.connection_kwargs
    picked = {k: kwargs[k] for k in _CONNECTION_KWARGS if kwargs.get(k) is not None}
    if "path" in picked:
        picked["unix_socket_path"] = picked.pop("path")
    return aredis.Redis(**picked)


def waiter_for(http: HttpRequest, state: ApiState) -> Waiter:
    """This app's waiter on the running event loop (a new loop gets a new one)."""
    waiter: Waiter | None = getattr(http.app.state, "waiter", None)
    if waiter is None or waiter.loop is not asyncio.get_running_loop():
        streams = [state.broker.keys.stream(q) for q in state.config.queues]
        waiter = Waiter(_async_redis(state), streams)
        http.app.state.waiter = waiter
    return waiter


def _fetcher(state: ApiState) -> Fetch:
    async def fetch(ids: list[str]) -> list[Request]:
        return await run_in_threadpool(state.broker.get_requests, ids)

    return fetch


async def long_poll(
    request_id: Annotated[str, Path()],
    http: HttpRequest,
    principal: Caller,
    state: State,
    wait: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_WAIT_S,
            description="long-poll: answer when the request is no longer pending, or after "
            "this many seconds (at most 60)",
        ),
    ] = None,
) -> None:
    """Dependency of `GET /v1/requests/{id}`: with `?wait=S`, return once the request is no
    longer pending (or S passed); the route then reads and answers it as usual. A request the
    caller may not see is not waited on (its 404 comes at once, as for an unknown id)."""
    if wait is not None:
        found = await _fetcher(state)([request_id])
        if not found or not seer(principal, state.config)(found[0]):
            raise NotFound(f"no request with id {request_id!r}")
        await waiter_for(http, state).until([request_id], wait, every=True, fetch=_fetcher(state))


LongPoll = Annotated[None, Depends(long_poll)]


class WaitBody(BaseModel):
    """POST /v1/requests/wait: wait for several requests at once."""

    model_config = ConfigDict(extra="forbid")

    ids: list[Annotated[str, Field(min_length=1, max_length=200, pattern=_ID)]] = Field(
        min_length=1, max_length=100
    )
    timeout_s: float = Field(gt=0, le=MAX_WAIT_S)
    all: bool = Field(default=True, description="wait for all of them (else the first)")


@router.post(
    "/wait",
    response_model=None,
    responses={
        200: {"model": list[Request], "description": "the requests, in the order asked"},
        **ERRORS,
    },
)
async def wait_requests(
    body: WaitBody, principal: Caller, http: HttpRequest, state: State
) -> JSONResponse:
    """Answer when all (or, with `"all": false`, the first) of the requests are no longer
    pending, or after `timeout_s` with them as they stand. An id the caller may not see is
    a 404, as an unknown one."""
    fetch = _fetcher(state)
    visible = seer(principal, state.config)
    found = {r.id for r in await fetch(body.ids) if visible(r)}
    missing = [rid for rid in body.ids if rid not in found]
    if missing:
        raise NotFound(f"no request with id {', '.join(repr(m) for m in missing[:10])}")
    got = await waiter_for(http, state).until(body.ids, body.timeout_s, every=body.all, fetch=fetch)
    by_id = {r.id: r for r in got}
    wanted = [by_id[rid] for rid in dict.fromkeys(body.ids) if rid in by_id]
    return JSONResponse([r.public() for r in wanted if visible(r)])
