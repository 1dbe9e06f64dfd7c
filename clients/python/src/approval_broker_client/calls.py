"""Every API call the clients make, built once and transport-free.

`RemoteBroker` sends a `Call` with `httpx.Client`, `AsyncRemoteBroker` with `httpx.AsyncClient`;
what to send and how to read the answer live here only, so the two can't drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from approval_broker_client.errors import error_for
from approval_broker_client.models import Decision, NewRequest, Outcome, Request, Run, Stats

MAX_WAIT_S = 60.0
"""The longest single long-poll the API accepts; longer waits are several in a row."""

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP call: what to send, and how to read a successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None

    def kwargs(self) -> dict[str, Any]:
        """The arguments of `httpx.Client.request` / `AsyncClient.request` for this call."""
        kwargs: dict[str, Any] = {"params": self.params, "headers": self.headers}
        if self.json is not None:
            kwargs["json"] = self.json
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        return kwargs

    def read(self, response: httpx.Response) -> T:
        """The answer's value, or the broker error an error answer stands for."""
        if response.is_error:
            raise error_for(response)
        return self.parse(response)


def _request(response: httpx.Response) -> Request:
    return Request.model_validate(response.json())


def _requests(response: httpx.Response) -> list[Request]:
    return [Request.model_validate(r) for r in response.json()]


def _run(response: httpx.Response) -> Run:
    return Run.model_validate(response.json())


def _idem(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key else {}


def new_request_body(new: BaseModel | Mapping[str, Any] | None, fields: dict[str, Any]) -> Any:
    """The JSON body of a create: a `NewRequest` (this package's or the broker's), a mapping,
    or keyword fields, checked against `NewRequest` before sending."""
    if isinstance(new, BaseModel):
        new = new.model_dump(mode="json", exclude_none=True)
    checked = NewRequest.model_validate({**(new or {}), **fields})
    return checked.model_dump(mode="json", exclude_none=True)


def decision_body(decision: BaseModel | Mapping[str, Any]) -> Any:
    if isinstance(decision, BaseModel) and not isinstance(decision, Decision):
        decision = decision.model_dump(mode="json", exclude_none=True)
    if not isinstance(decision, Decision):
        decision = Decision.model_validate(decision)
    return decision.model_dump(
        mode="json", exclude_none=True, exclude={"decided_by", "decided_at", "receipt"}
    )


def outcome(value: Outcome, **fields: Any) -> Decision:
    return Decision(outcome=value, **{k: v for k, v in fields.items() if v is not None})


class Calls:
    """The API calls, transport-free; `timeout` is the client's, long-polls add their wait."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def create_request(
        self,
        new: BaseModel | Mapping[str, Any] | None,
        idempotency_key: str | None,
        fields: dict[str, Any],
    ) -> Call[Request]:
        body = new_request_body(new, fields)
        return Call("POST", "/v1/requests", _request, body, headers=_idem(idempotency_key))

    def get_request(self, request_id: str, wait: float | None) -> Call[Request]:
        params = {} if wait is None else {"wait": min(wait, MAX_WAIT_S)}
        timeout = None if wait is None else self.timeout + min(wait, MAX_WAIT_S)
        return Call("GET", f"/v1/requests/{request_id}", _request, params=params, timeout=timeout)

    def list_requests(
        self, status: str | None, queue: str | None, limit: int
    ) -> Call[list[Request]]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = str(status)
        if queue:
            params["queue"] = queue
        return Call("GET", "/v1/requests", _requests, params=params)

    def decide(self, request_id: str, decision: BaseModel | Mapping[str, Any]) -> Call[Request]:
        body = decision_body(decision)
        return Call("POST", f"/v1/requests/{request_id}/decision", _request, body)

    def wait(self, ids: Sequence[str], timeout_s: float, every: bool) -> Call[list[Request]]:
        timeout_s = min(max(timeout_s, 0.001), MAX_WAIT_S)
        body = {"ids": list(ids), "timeout_s": timeout_s, "all": every}
        return Call("POST", "/v1/requests/wait", _requests, body, timeout=self.timeout + timeout_s)

    def start_run(self, agent: str, prompt: str, idempotency_key: str | None) -> Call[str]:
        body = {"agent": agent, "prompt": prompt}
        return Call(
            "POST",
            "/v1/runs",
            lambda r: str(r.json()["run_id"]),
            body,
            headers=_idem(idempotency_key),
        )

    def get_run(self, run_id: str) -> Call[Run]:
        return Call("GET", f"/v1/runs/{run_id}", _run)

    def jwks(self) -> Call[dict[str, Any]]:
        return Call("GET", "/.well-known/jwks.json", lambda r: dict(r.json()))

    def spend_receipt(
        self, request_id: str, tool_name: str, args: Mapping[str, Any]
    ) -> Call[dict[str, Any]]:
        body = {"tool_name": tool_name, "args": dict(args)}
        return Call(
            "POST", f"/v1/requests/{request_id}/receipt/spend", lambda r: dict(r.json()), body
        )

    def send_prompt(self, run_id: str, prompt: str) -> Call[Run]:
        return Call("POST", f"/v1/runs/{run_id}/messages", _run, {"prompt": prompt})

    def stats(self, since: str | None, until: str | None) -> Call[Stats]:
        params = {k: v for k, v in (("since", since), ("until", until)) if v is not None}
        return Call("GET", "/v1/stats", lambda r: Stats.model_validate(r.json()), params=params)


def all_done(requests: Sequence[Request]) -> bool:
    return all(not r.is_pending for r in requests)


def all_pending(requests: Sequence[Request]) -> bool:
    return all(r.is_pending for r in requests)
