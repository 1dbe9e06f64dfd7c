"""Request and response bodies of the HTTP API (what /openapi.json documents).

Bodies are checked for what pydantic lets through but Redis or JSON can't carry back out:
non-finite numbers (`1e400`, `NaN`) and lone surrogates. Refusing them here keeps a 422 from
turning into a 500 when the stored value is read back.
"""

from __future__ import annotations

from typing import Any, Literal

from approval_broker_client.models import ConflictBody, ErrorBody
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from broker.domain.bodies import DecisionBody, check_json_safe
from broker.domain.models import NewRequest


class NewRequestBody(NewRequest):
    """POST /v1/requests: a request from an agent that isn't Python (callback: a webhook name)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _check(self) -> NewRequestBody:
        check_json_safe(self.model_dump(), "body")
        return self


class RunStart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=200)
    prompt: str = Field(max_length=100_000)

    @model_validator(mode="after")
    def _check(self) -> RunStart:
        check_json_safe(self.model_dump(), "body")
        return self


class RunStarted(BaseModel):
    run_id: str


class Health(BaseModel):
    status: Literal["ok"]


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "no or bad bearer token"},
    403: {"model": ErrorBody, "description": "the caller lacks the role"},
    404: {"model": ErrorBody, "description": "no such thing"},
    422: {"model": ErrorBody, "description": "malformed or inapplicable input"},
}


__all__ = [
    "ERRORS",
    "ConflictBody",
    "DecisionBody",
    "ErrorBody",
    "NewRequestBody",
    "RunStart",
    "RunStarted",
    "check_json_safe",
]
