"""The approver inbox at `/`: one server-rendered page, a little JavaScript, no build step.

The page signs in with a bearer token kept in the browser's sessionStorage only, reads the
same REST API as everyone else, and follows `/v1/events` to update without a reload.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from api.auth import Caller
from api.state import State

router = APIRouter(tags=["inbox"])
_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=select_autoescape()
)


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def inbox(state: State) -> HTMLResponse:
    """The inbox page; its data comes from the API once the approver signs in."""
    queues = sorted(state.config.queues)
    return HTMLResponse(_templates.get_template("inbox.html").render(queues=queues))


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
