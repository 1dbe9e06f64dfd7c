"""`GET /v1/audit`: the audit trail, a page at a time, for role `auditor` (and the admin).

Reading only: the entries are appended by the broker's steps (`broker.audit`). Paging follows
the listings (`Link: rel="next"`, `X-Next-Cursor`); a page goes chain by chain, in order.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse

from api.auth import Caller
from api.schemas import ERRORS
from api.state import State
from broker.audit.chain import Entry
from broker.domain.errors import Forbidden, InvalidInput
from broker.domain.principals import AUDITOR

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get(
    "",
    response_model=None,
    responses={
        200: {
            "model": list[Entry],
            "description": 'one page of entries; the next is in `Link: <...>; rel="next"`',
        },
        **ERRORS,
    },
)
def list_audit(
    principal: Caller,
    state: State,
    http: HttpRequest,
    since: Annotated[
        datetime | None, Query(description="entries from this time (ISO 8601, with a zone)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    cursor: Annotated[
        str | None, Query(min_length=1, max_length=200, description="from a `Link: rel=next`")
    ] = None,
) -> JSONResponse:
    """Audit entries, oldest first per chain; role `auditor` (it sees everything)."""
    if not principal.has_role(AUDITOR):
        raise Forbidden("the audit trail is for role 'auditor'")
    if since is not None and since.tzinfo is None:
        raise InvalidInput("since: give a time zone, as in 2026-12-01T00:00:00Z")
    entries, next_cursor = state.broker.audit.page(since, cursor, limit)
    response = JSONResponse([e.model_dump() for e in entries])
    if next_cursor:
        params = [(k, v) for k, v in http.query_params.multi_items() if k != "cursor"]
        url = f"{http.url.path}?{urlencode([*params, ('cursor', next_cursor)])}"
        response.headers["Link"] = f'<{url}>; rel="next"'
        response.headers["X-Next-Cursor"] = next_cursor
    return response
