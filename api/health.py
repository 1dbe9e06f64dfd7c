"""`/healthz`: 200 when Redis answers, 503 otherwise (load balancers and `up` poll it)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from api.errors import error_response
from api.schemas import ErrorBody, Health
from api.state import State

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=None,
    responses={200: {"model": Health}, 503: {"model": ErrorBody}},
)
def healthz(state: State) -> JSONResponse:
    try:
        state.broker.redis.ping()
    except RedisError:
        return error_response(503, "unavailable", "Redis does not answer")
    return JSONResponse({"status": "ok"})
