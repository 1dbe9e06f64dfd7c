"""Insights over HTTP (`GET /v1/stats`): how approvals went over a window.

Every caller gets the figures of the requests it may read (`api.visibility.sees_cell`, the
same rule as every read path); the per-approver counts only the admin and auditors. The window
is checked by `broker.domain.insights` (422 `invalid_window`); the figures come from the
rollups the Lua steps keep (`broker.store.insights`), so a call costs the same at a thousand
requests as at a million. A sync route: FastAPI runs it on its thread pool, off the event loop.
"""

from __future__ import annotations

from typing import Annotated

from approval_broker_client.models import Stats
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from api.auth import Caller
from api.schemas import ERRORS
from api.state import State
from api.visibility import sees_all, sees_cell
from broker.domain.insights import Cell, summarize, window

router = APIRouter(tags=["insights"])

When = Annotated[
    str | None,
    Query(min_length=1, max_length=64, description="ISO 8601 time (no zone: UTC)"),
]


@router.get(
    "/v1/stats",
    response_model=None,
    responses={200: {"model": Stats, "description": "the window's figures"}, **ERRORS},
)
def stats(principal: Caller, state: State, since: When = None, until: When = None) -> JSONResponse:
    """Requests by outcome, queue, tool and agent, who decided, time to decision (p50/p90),
    escalations, rule hits and reject reasons, over `since`..`until` (default the last 24
    hours; at most a year), counted by the hour."""
    insights = state.broker.insights
    start, end = window(since, until, insights.now())
    counters, start, end = insights.counters(start, end)
    config = state.config

    def sees(cell: Cell) -> bool:
        return sees_cell(principal, cell, config)

    body = summarize(counters, sees, people=sees_all(principal), since=start, until=end)
    return JSONResponse(body)
