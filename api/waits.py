"""Long-polls: answer when requests are no longer pending, or after a timeout (at most 60 s).

`GET /v1/requests/{id}?wait=S` (the `long_poll` dependency of that route) and
`POST /v1/requests/wait` for several. Nothing polls Redis: every outcome is announced on the
request's queue stream by the same Lua step that records it, and one reader task per API process
and event loop follows those streams (XREAD BLOCK) and wakes the handlers waiting on that
request id (`api.follow`; on a Redis Cluster a blocking read per partition). The reader fixes
its stream positions *before* a handler first reads the request, so an outcome recorded after
that read is always seen; it stops when nobody waits.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.auth import Caller
from api.follow import Fetch, waiter_for
from api.schemas import ERRORS
from api.state import ApiState, State
from api.visibility import seer
from broker.domain.errors import NotFound
from broker.domain.models import Request
from broker.domain.principals import Principal

router = APIRouter(prefix="/v1/requests", tags=["requests"])

MAX_WAIT_S = 60.0
_ID = r"^[A-Za-z0-9_.-]+$"


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
        await wait_for_outcome(http, state, principal, request_id, wait)


async def wait_for_outcome(
    http: HttpRequest, state: ApiState, principal: Principal, request_id: str, wait: float
) -> None:
    """Return once the request is no longer pending, or after `wait` seconds (at most 60);
    NotFound at once for one `principal` may not see. `?wait=` and `/mcp` wait this way."""
    found = await _fetcher(state)([request_id])
    if not found or not seer(principal, state.config)(found[0]):
        raise NotFound(f"no request with id {request_id!r}")
    wait = min(wait, MAX_WAIT_S)
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
