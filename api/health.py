"""`/healthz`: 200 when Redis answers, 503 otherwise (load balancers and `up` poll it).

The PING runs in the thread pool (never on the event loop) under a short bound of its own, so
the answer comes within about a second even when Redis stalls or every thread waits on it (the
thread itself is freed by the client's socket timeout).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool

from api.errors import error_response
from api.schemas import ErrorBody, Health
from api.state import State

router = APIRouter(tags=["operations"])

PING_TIMEOUT_S = 1.0
"""Redis answers a PING in well under a millisecond; after this, say 503 (load balancers wait
about two seconds for a health check)."""


@router.get(
    "/healthz",
    response_model=None,
    responses={200: {"model": Health}, 503: {"model": ErrorBody}},
)
async def healthz(state: State) -> JSONResponse:
    try:
        await asyncio.wait_for(run_in_threadpool(state.broker.fleet.ping), PING_TIMEOUT_S)
    except (RedisError, TimeoutError):
        return error_response(503, "unavailable", "Redis does not answer")
    return JSONResponse({"status": "ok"})
