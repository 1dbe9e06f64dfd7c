"""`Idempotency-Key` on the create routes (`POST /v1/requests`, `POST /v1/runs`).

The same key and body from the same principal within 24 hours answers the original (200); the
same key with another body is 422 `idempotency_mismatch`. A key is claimed with `SET NX`, so of
concurrent creates with one key exactly one creates; the others wait briefly for its id. A
create that fails releases its claim, so errors are not replayed. Holds no state of its own:
the key and its commands are the core's (`broker.store.idempotency`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api.errors import ApiError
from api.state import ApiState
from broker.domain.models import NewRequest, canonical_json
from broker.domain.principals import Principal
from broker.runs.starting import start_run

TTL_S = 24 * 3600
LOSER_WAIT_S = 10.0
"""How long a concurrent create with the same key waits for the winner's id."""
_POLL_S = 0.005
CLAIM_TTL_S = int(3 * LOSER_WAIT_S)
"""A claim (no id yet) lives this long: a create that crashed frees its key after it, not 24 h;
the id, once written, is kept for TTL_S. A loser finding the claim gone claims the key itself."""

IdempotencyKey = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=255,
        description="the same key and body within 24 h answer the original (200)",
    ),
]


def body_hash(body: BaseModel) -> str:
    """sha256 of the body as validated (canonical JSON), so key order and spacing don't count."""
    return hashlib.sha256(canonical_json(body.model_dump(mode="json")).encode()).hexdigest()


def _mismatch() -> ApiError:
    return ApiError(
        422,
        "idempotency_mismatch",
        "this Idempotency-Key was used with another body; use a new key for a new create",
    )


def once(
    state: ApiState,
    scope: str,
    principal: Principal,
    idempotency_key: str,
    body: BaseModel,
    create: Callable[[], str],
) -> tuple[str, bool]:
    """The id `create()` made for this key and body: (id, True) when created now, else the
    original's id and False. Raises 422 `idempotency_mismatch` for another body."""
    claim = state.broker.idempotency.claim(scope, principal.name, idempotency_key)
    digest = body_hash(body)
    deadline = time.monotonic() + LOSER_WAIT_S
    while True:
        if claim.take(digest, CLAIM_TTL_S):
            try:
                made = create()
            except BaseException:
                claim.release()
                raise
            claim.fill(digest, made, TTL_S)
            return made, True
        stored = claim.read()
        if stored is not None:
            stored_hash, made = stored
            if stored_hash != digest:
                raise _mismatch()
            if made:
                return made, False
        if time.monotonic() > deadline:
            raise ApiError(
                409,
                "idempotency_in_progress",
                "a create with this Idempotency-Key is still in progress; try again",
            )
        time.sleep(_POLL_S)


def create_request_once(
    state: ApiState, principal: Principal, idempotency_key: str, body: NewRequest
) -> JSONResponse:
    """POST /v1/requests with a key: 201 with the new request, or 200 with the original."""
    rid, created = once(
        state, "requests", principal, idempotency_key, body,
        lambda: state.broker.requests.create_request(body, created_by=principal.name).id,
    )  # fmt: skip
    return JSONResponse(state.broker.get_request(rid).public(), status_code=201 if created else 200)


def start_run_once(
    state: ApiState, principal: Principal, idempotency_key: str, body: Any
) -> JSONResponse:
    """POST /v1/runs with a key: 202 with the new run's id, or 200 with the original's."""
    run_id, created = once(
        state, "runs", principal, idempotency_key, body,
        lambda: start_run(state.broker, body.agent, body.prompt, started_by=principal.name).id,
    )  # fmt: skip
    return JSONResponse({"run_id": run_id}, status_code=202 if created else 200)
