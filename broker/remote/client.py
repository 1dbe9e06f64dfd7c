"""A typed client of the HTTP API v1 (httpx), sync (`RemoteBroker`) and async (`AsyncRemoteBroker`).

For apps and agents that don't run on the fleet and don't reach its Redis: requests, decisions,
runs and long-poll waits. Error answers are raised as the broker's own errors (`NotFound`,
`Conflict` carrying the winning request, `Forbidden`, `InvalidInput`), so code written against
`broker.client.Broker` handles them the same way. Each call is built once (`_Calls`) and sent by
either transport, so the two clients can't drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx
from pydantic_ai import DeferredToolRequests, DeferredToolResults

from broker.models import Decision, NewRequest, Outcome, Request, Run
from broker.remote.errors import RemoteError, Unauthorized, error_for
from broker.results import RoundNotReady, results_for

MAX_WAIT_S = 60.0
"""The longest single long-poll the API accepts; longer waits are several in a row."""
META_KEY = "approval_broker_request_id"
"""Where `BrokerApprovals` notes, in a deferred call's metadata, the request it became."""

_T = TypeVar("_T")


def request_ids(deferred: DeferredToolRequests) -> list[str]:
    """The broker request of each call of a stopped run, as `BrokerApprovals` noted them."""
    ids = []
    for call in [*deferred.approvals, *deferred.calls]:
        rid = (deferred.metadata.get(call.tool_call_id) or {}).get(META_KEY)
        if not isinstance(rid, str):
            raise ValueError(
                f"deferred call {call.tool_call_id} carries no broker request id; were these "
                "DeferredToolRequests made by a run with BrokerApprovals?"
            )
        ids.append(rid)
    return ids


def _ids_of(requests: DeferredToolRequests | Iterable[Request | str]) -> list[str]:
    if isinstance(requests, DeferredToolRequests):
        return request_ids(requests)
    return [r.id if isinstance(r, Request) else r for r in requests]


def _all_done(requests: Sequence[Request]) -> bool:
    return all(not r.is_pending for r in requests)


def all_pending(requests: Sequence[Request]) -> bool:
    return all(r.is_pending for r in requests)


@dataclass(frozen=True)
class _Call(Generic[_T]):
    """One HTTP call: what to send, and how to read a successful answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], _T]
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None


def _request(response: httpx.Response) -> Request:
    return Request.model_validate(response.json())


def _requests(response: httpx.Response) -> list[Request]:
    return [Request.model_validate(r) for r in response.json()]


def _run(response: httpx.Response) -> Run:
    return Run.model_validate(response.json())


def _idem(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key else {}


class _Calls:
    """Every API call this client makes, transport-free."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def create_request(
        self, new: NewRequest | None, idempotency_key: str | None, fields: dict[str, Any]
    ) -> _Call[Request]:
        body = (new or NewRequest(**fields)).model_dump(mode="json", exclude_none=True)
        return _Call("POST", "/v1/requests", _request, body, headers=_idem(idempotency_key))

    def get_request(self, request_id: str, wait: float | None) -> _Call[Request]:
        params = {} if wait is None else {"wait": min(wait, MAX_WAIT_S)}
        timeout = None if wait is None else self.timeout + min(wait, MAX_WAIT_S)
        return _Call("GET", f"/v1/requests/{request_id}", _request, params=params, timeout=timeout)

    def list_requests(
        self, status: str | None, queue: str | None, limit: int
    ) -> _Call[list[Request]]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = str(status)
        if queue:
            params["queue"] = queue
        return _Call("GET", "/v1/requests", _requests, params=params)

    def decide(self, request_id: str, decision: Decision | dict[str, Any]) -> _Call[Request]:
        if isinstance(decision, dict):
            decision = Decision.model_validate(decision)
        body = decision.model_dump(
            mode="json", exclude_none=True, exclude={"decided_by", "decided_at"}
        )
        return _Call("POST", f"/v1/requests/{request_id}/decision", _request, body)

    def wait(self, ids: Sequence[str], timeout_s: float, every: bool) -> _Call[list[Request]]:
        timeout_s = min(max(timeout_s, 0.001), MAX_WAIT_S)
        body = {"ids": list(ids), "timeout_s": timeout_s, "all": every}
        return _Call("POST", "/v1/requests/wait", _requests, body, timeout=self.timeout + timeout_s)

    def start_run(self, agent: str, prompt: str, idempotency_key: str | None) -> _Call[str]:
        body = {"agent": agent, "prompt": prompt}
        return _Call(
            "POST",
            "/v1/runs",
            lambda r: str(r.json()["run_id"]),
            body,
            headers=_idem(idempotency_key),
        )

    def get_run(self, run_id: str) -> _Call[Run]:
        return _Call("GET", f"/v1/runs/{run_id}", _run)

    def send_prompt(self, run_id: str, prompt: str) -> _Call[Run]:
        return _Call("POST", f"/v1/runs/{run_id}/messages", _run, {"prompt": prompt})


def _outcome(outcome: Outcome, **fields: Any) -> Decision:
    return Decision(outcome=outcome, **{k: v for k, v in fields.items() if v is not None})


class _Base:
    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._calls = _Calls(timeout)
        self._headers = {"Authorization": f"Bearer {token}", "User-Agent": "approval-broker-remote"}

    @staticmethod
    def _read(call: _Call[_T], response: httpx.Response) -> _T:
        if response.is_error:
            raise error_for(response)
        return call.parse(response)

    def _kwargs(self, call: _Call[Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"params": call.params, "headers": call.headers}
        if call.json is not None:
            kwargs["json"] = call.json
        if call.timeout is not None:
            kwargs["timeout"] = call.timeout
        return kwargs


class RemoteBroker(_Base):
    """The broker over HTTP, for a thread that may block: `RemoteBroker(base_url, token)`."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        super().__init__(base_url, token, timeout=timeout)
        self.http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=timeout)

    def _send(self, call: _Call[_T]) -> _T:
        return self._read(call, self.http.request(call.method, call.path, **self._kwargs(call)))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # requests and decisions
    def create_request(
        self, new: NewRequest | None = None, /, *, idempotency_key: str | None = None, **fields: Any
    ) -> Request:
        """Create a request (role `requester`); with `idempotency_key`, at most once."""
        return self._send(self._calls.create_request(new, idempotency_key, fields))

    def get_request(self, request_id: str, *, wait: float | None = None) -> Request:
        """A request; with `wait` (seconds, at most 60) once it is no longer pending, or then."""
        return self._send(self._calls.get_request(request_id, wait))

    def list_requests(
        self, *, status: str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Request]:
        return self._send(self._calls.list_requests(status, queue, limit))

    def decide(self, request_id: str, decision: Decision | dict[str, Any]) -> Request:
        return self._send(self._calls.decide(request_id, decision))

    def approve(self, request_id: str, **fields: Any) -> Request:
        return self.decide(request_id, _outcome(Outcome.approved, **fields))

    def reject(self, request_id: str, reason: str | None = None, **fields: Any) -> Request:
        return self.decide(request_id, _outcome(Outcome.rejected, reason=reason, **fields))

    def modify(self, request_id: str, args: dict[str, Any], **fields: Any) -> Request:
        return self.decide(request_id, _outcome(Outcome.modified, args=args, **fields))

    def answer(self, request_id: str, answer: Any, **fields: Any) -> Request:
        return self.decide(request_id, _outcome(Outcome.answered, answer=answer, **fields))

    def escalate(
        self, request_id: str, target: str | None = None, reason: str | None = None
    ) -> Request:
        return self.decide(request_id, _outcome(Outcome.escalated, target=target, reason=reason))

    # waits
    def wait(self, ids: Sequence[str], timeout_s: float, *, all: bool = True) -> list[Request]:
        """One long-poll (at most 60 s): the requests once all (or one) are decided, or then."""
        return self._send(self._calls.wait(ids, timeout_s, all))

    def wait_for(self, ids: Sequence[str], timeout_s: float, *, all: bool = True) -> list[Request]:
        """Like `wait`, for any length of time (long-polls in a row)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.wait(ids, deadline - time.monotonic(), all=all)
            done = _all_done(got) if all else not all_pending(got)
            if done or time.monotonic() >= deadline:
                return got

    def results_for(
        self, requests: DeferredToolRequests | Iterable[Request | str], *, wait_s: float = 0
    ) -> DeferredToolResults:
        """`DeferredToolResults` for a stopped run, once every call has an outcome (waiting up
        to `wait_s` for that); raises `RoundNotReady` if one is still pending."""
        ids = _ids_of(requests)
        got = self.wait_for(ids, wait_s) if wait_s > 0 else [self.get_request(i) for i in ids]
        return results_for(got)

    # runs
    def start_run(self, agent: str, prompt: str, *, idempotency_key: str | None = None) -> str:
        """Start a registered agent on the fleet; returns the run id."""
        return self._send(self._calls.start_run(agent, prompt, idempotency_key))

    def get_run(self, run_id: str) -> Run:
        return self._send(self._calls.get_run(run_id))

    def send_prompt(self, run_id: str, prompt: str) -> Run:
        """A new prompt instead of answers: the run's waiting calls are rejected, it goes on."""
        return self._send(self._calls.send_prompt(run_id, prompt))


class AsyncRemoteBroker(_Base):
    """The broker over HTTP, for asyncio code: the same methods as `RemoteBroker`, awaited."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        super().__init__(base_url, token, timeout=timeout)
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, timeout=timeout
        )

    async def _send(self, call: _Call[_T]) -> _T:
        response = await self.http.request(call.method, call.path, **self._kwargs(call))
        return self._read(call, response)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def create_request(
        self, new: NewRequest | None = None, /, *, idempotency_key: str | None = None, **fields: Any
    ) -> Request:
        return await self._send(self._calls.create_request(new, idempotency_key, fields))

    async def get_request(self, request_id: str, *, wait: float | None = None) -> Request:
        return await self._send(self._calls.get_request(request_id, wait))

    async def list_requests(
        self, *, status: str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Request]:
        return await self._send(self._calls.list_requests(status, queue, limit))

    async def decide(self, request_id: str, decision: Decision | dict[str, Any]) -> Request:
        return await self._send(self._calls.decide(request_id, decision))

    async def approve(self, request_id: str, **fields: Any) -> Request:
        return await self.decide(request_id, _outcome(Outcome.approved, **fields))

    async def reject(self, request_id: str, reason: str | None = None, **fields: Any) -> Request:
        return await self.decide(request_id, _outcome(Outcome.rejected, reason=reason, **fields))

    async def modify(self, request_id: str, args: dict[str, Any], **fields: Any) -> Request:
        return await self.decide(request_id, _outcome(Outcome.modified, args=args, **fields))

    async def answer(self, request_id: str, answer: Any, **fields: Any) -> Request:
        return await self.decide(request_id, _outcome(Outcome.answered, answer=answer, **fields))

    async def escalate(
        self, request_id: str, target: str | None = None, reason: str | None = None
    ) -> Request:
        return await self.decide(
            request_id, _outcome(Outcome.escalated, target=target, reason=reason)
        )

    async def wait(
        self, ids: Sequence[str], timeout_s: float, *, all: bool = True
    ) -> list[Request]:
        return await self._send(self._calls.wait(ids, timeout_s, all))

    async def wait_for(
        self, ids: Sequence[str], timeout_s: float, *, all: bool = True
    ) -> list[Request]:
        deadline = time.monotonic() + timeout_s
        while True:
            got = await self.wait(ids, deadline - time.monotonic(), all=all)
            done = _all_done(got) if all else not all_pending(got)
            if done or time.monotonic() >= deadline:
                return got

    async def results_for(
        self, requests: DeferredToolRequests | Iterable[Request | str], *, wait_s: float = 0
    ) -> DeferredToolResults:
        ids = _ids_of(requests)
        if wait_s > 0:
            got = await self.wait_for(ids, wait_s)
        else:
            got = [await self.get_request(i) for i in ids]
        return results_for(got)

    async def start_run(
        self, agent: str, prompt: str, *, idempotency_key: str | None = None
    ) -> str:
        return await self._send(self._calls.start_run(agent, prompt, idempotency_key))

    async def get_run(self, run_id: str) -> Run:
        return await self._send(self._calls.get_run(run_id))

    async def send_prompt(self, run_id: str, prompt: str) -> Run:
        return await self._send(self._calls.send_prompt(run_id, prompt))


__all__ = [
    "AsyncRemoteBroker",
    "RemoteBroker",
    "RemoteError",
    "RoundNotReady",
    "Unauthorized",
    "error_for",
    "request_ids",
]
