"""Who am I and which queues are there (`/v1/me`, `/v1/queues`): what the inbox page, the CLI
and other clients read to show a signed-in person their work."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.auth import Caller
from api.state import State

router = APIRouter(tags=["inbox"])


@router.get("/v1/me", response_model=None)
def me(principal: Caller) -> JSONResponse:
    """Who the bearer token belongs to, and their roles (the inbox shows it after sign-in)."""
    return JSONResponse({"name": principal.name, "roles": sorted(principal.roles)})


@router.get("/v1/queues", response_model=None)
def queues(principal: Caller, state: State) -> JSONResponse:
    """The handler queues with their timeouts, escalation targets and `pending` counts.

    A count is the queue's total, fleet-wide (kept by the Lua steps in each partition's `counts`
    hash: one HMGET per partition, whatever is stored), not only the requests the caller may see.
    """
    names = sorted(state.config.queues)
    pending = state.broker.requests.pending_counts(names)
    return JSONResponse(
        [
            {
                "name": name,
                "timeout_s": state.config.queues[name].timeout_s,
                "escalate_to": state.config.queues[name].escalate_to,
                "pending": pending[name],
            }
            for name in names
        ]
    )
