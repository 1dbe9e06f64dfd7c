"""The framework's own ceiling for a decision: a FastAPI route of the decide route's shape, no broker.

`bench_api.py` serves this app in its third phase (`--no-bare` skips it) on stock uvicorn
(httptools, uvloop, no access log: the API's settings) and sends it the same requests it sends
the broker: `POST /v1/requests/{id}/decision` with a bearer token and `{"outcome": "approved"}`. The route does
what every decision pays before the broker is reached (path and body validation by FastAPI and
pydantic, a bearer-token dependency comparing a SHA-256, a JSON answer the size of a request's)
and nothing after it: no Redis, no judge, no middleware. Its CPU per request is the floor under
the broker's own; the difference is what the broker adds.

    uv run uvicorn --app-dir bench bare_decide:app --port 8001 --loop uvloop --http httptools
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

TOKEN_SHA256 = hashlib.sha256(b"bench-token").hexdigest()  # bench_api.py's TOKEN

app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)


class Body(BaseModel):
    """A decision's body, as far as this route needs one."""

    outcome: Literal["approved", "rejected"]
    reason: Annotated[str | None, Field(max_length=2000)] = None


async def caller(authorization: Annotated[str, Header()] = "") -> str:
    """The bearer token's holder: a SHA-256 compared in constant time, as the API does."""
    token = authorization.removeprefix("Bearer ")
    if not hmac.compare_digest(hashlib.sha256(token.encode()).hexdigest(), TOKEN_SHA256):
        raise HTTPException(401, "bad token")
    return "bench"


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/requests/{request_id}/decision")
async def decide(
    request_id: Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$")],
    body: Body,
    who: Annotated[str, Depends(caller)],
) -> JSONResponse:
    now = datetime.now(UTC).isoformat()
    return JSONResponse(
        {
            "id": request_id,
            "status": body.outcome,
            "queue": "default",
            "tool_name": "issue_refund",
            "args": {"order_id": "A1", "amount": 10},
            "decision": {"outcome": body.outcome, "decided_by": who, "decided_at": now},
            "history": [{"event": "created", "at": now}, {"event": body.outcome, "at": now}],
        }
    )
