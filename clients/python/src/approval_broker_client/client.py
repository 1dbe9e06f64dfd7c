"""A typed client of the HTTP API v1 (httpx), sync (`RemoteBroker`) and async (`AsyncRemoteBroker`).

For apps and agents that don't run on the fleet and don't reach its Redis: requests, decisions,
runs and long-poll waits. Error answers are raised as the broker's own errors (`NotFound`,
`Conflict` carrying the winning request, `Forbidden`, `InvalidInput`). Each call is built once
(`calls.Calls`) and sent by either transport, so the two clients can't drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import httpx
from pydantic import BaseModel

from approval_broker_client.calls import Call, Calls, all_done, all_pending, outcome
from approval_broker_client.models import Outcome, Request, Run, Stats

if TYPE_CHECKING:
    from pydantic_ai import DeferredToolRequests, DeferredToolResults

_T = TypeVar("_T")
NewLike = BaseModel | Mapping[str, Any]
DecisionLike = BaseModel | Mapping[str, Any]


def _ids_of(requests: Any) -> list[str]:
    """Request ids of a stopped run's `DeferredToolRequests`, or of requests / ids."""
    from approval_broker_client.deferred import request_ids

    if hasattr(requests, "approvals") and hasattr(requests, "calls"):
        return request_ids(requests)
    return [r if isinstance(r, str) else r.id for r in requests]


def _results(got: Sequence[Request]) -> DeferredToolResults:
    """The round's results, each approved call's metadata naming its request, so that
    `BrokerApprovals` can check the call's receipt when the run resumes in a later process."""
    from approval_broker_client.deferred import META_KEY
    from approval_broker_client.results import results_for

    results = results_for(got)
    for request in got:
        if request.kind == "approval" and str(request.status) in ("approved", "modified"):
            call_id = request.tool_call_id
            results.metadata[call_id] = {**results.metadata.get(call_id, {}), META_KEY: request.id}
    return results


IDLE_S = 3.0
"""How long an idle connection is kept for the next request: below the API's keep-alive
timeout (5 s). httpx's default is those same 5 s, so a request could go out on a connection
the server was closing at that moment and be lost ("Server disconnected")."""
LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=IDLE_S)
"""httpx's default limits, but for the idle time."""


class _Base:
    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._calls = Calls(timeout)
        self._headers = {"Authorization": f"Bearer {token}", "User-Agent": "approval-broker-client"}


class RemoteBroker(_Base):
    """The broker over HTTP, for a thread that may block: `RemoteBroker(base_url, token)`."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        super().__init__(base_url, token, timeout=timeout)
        self.http = httpx.Client(
            base_url=self.base_url, headers=self._headers, timeout=timeout, limits=LIMITS
        )

    def _send(self, call: Call[_T]) -> _T:
        return call.read(self.http.request(call.method, call.path, **call.kwargs()))

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
        self, new: NewLike | None = None, /, *, idempotency_key: str | None = None, **fields: Any
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

    def decide(self, request_id: str, decision: DecisionLike) -> Request:
        return self._send(self._calls.decide(request_id, decision))

    def approve(self, request_id: str, **fields: Any) -> Request:
        return self.decide(request_id, outcome(Outcome.approved, **fields))

    def reject(self, request_id: str, reason: str | None = None, **fields: Any) -> Request:
        return self.decide(request_id, outcome(Outcome.rejected, reason=reason, **fields))

    def modify(self, request_id: str, args: dict[str, Any], **fields: Any) -> Request:
        return self.decide(request_id, outcome(Outcome.modified, args=args, **fields))

    def answer(self, request_id: str, answer: Any, **fields: Any) -> Request:
        return self.decide(request_id, outcome(Outcome.answered, answer=answer, **fields))

    def escalate(
        self, request_id: str, target: str | None = None, reason: str | None = None
    ) -> Request:
        return self.decide(request_id, outcome(Outcome.escalated, target=target, reason=reason))

    # waits
    def wait(self, ids: Sequence[str], timeout_s: float, *, all: bool = True) -> list[Request]:
        """One long-poll (at most 60 s): the requests once all (or one) are decided, or then."""
        return self._send(self._calls.wait(ids, timeout_s, all))

    def wait_for(self, ids: Sequence[str], timeout_s: float, *, all: bool = True) -> list[Request]:
        """Like `wait`, for any length of time (long-polls in a row)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.wait(ids, deadline - time.monotonic(), all=all)
            done = all_done(got) if all else not all_pending(got)
            if done or time.monotonic() >= deadline:
                return got

    def results_for(
        self, requests: DeferredToolRequests | Iterable[Request | str], *, wait_s: float = 0
    ) -> DeferredToolResults:
        """`DeferredToolResults` for a stopped run, once every call has an outcome (waiting up
        to `wait_s` for that); raises `RoundNotReady` if one is still pending. Needs the
        `pydantic-ai` extra."""
        ids = _ids_of(requests)
        got = self.wait_for(ids, wait_s) if wait_s > 0 else [self.get_request(i) for i in ids]
        return _results(got)

    # runs
    def start_run(self, agent: str, prompt: str, *, idempotency_key: str | None = None) -> str:
        """Start a registered agent on the fleet; returns the run id."""
        return self._send(self._calls.start_run(agent, prompt, idempotency_key))

    def get_run(self, run_id: str) -> Run:
        return self._send(self._calls.get_run(run_id))

    def stats(self, *, since: str | None = None, until: str | None = None) -> Stats:
        """`GET /v1/stats`: how approvals went over a window (ISO 8601; default the last 24 h),
        of the requests this token may see."""
        return self._send(self._calls.stats(since, until))

    def jwks(self) -> dict[str, Any]:
        """The public keys approval receipts are signed with (no token needed)."""
        return self._send(self._calls.jwks())

    def spend_receipt(
        self, request_id: str, tool_name: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Spend the request's receipt just before running its tool (a `Conflict` with code
        `receipt_refused`: do not run it)."""
        return self._send(self._calls.spend_receipt(request_id, tool_name, args))

    def send_prompt(self, run_id: str, prompt: str) -> Run:
        """A new prompt instead of answers: the run's waiting calls are rejected, it goes on."""
        return self._send(self._calls.send_prompt(run_id, prompt))


class AsyncRemoteBroker(_Base):
    """The broker over HTTP, for asyncio code: the same methods as `RemoteBroker`, awaited."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0) -> None:
        super().__init__(base_url, token, timeout=timeout)
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, timeout=timeout, limits=LIMITS
        )

    async def _send(self, call: Call[_T]) -> _T:
        return call.read(await self.http.request(call.method, call.path, **call.kwargs()))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def create_request(
        self, new: NewLike | None = None, /, *, idempotency_key: str | None = None, **fields: Any
    ) -> Request:
        return await self._send(self._calls.create_request(new, idempotency_key, fields))

    async def get_request(self, request_id: str, *, wait: float | None = None) -> Request:
        return await self._send(self._calls.get_request(request_id, wait))

    async def list_requests(
        self, *, status: str | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Request]:
        return await self._send(self._calls.list_requests(status, queue, limit))

    async def decide(self, request_id: str, decision: DecisionLike) -> Request:
        return await self._send(self._calls.decide(request_id, decision))

    async def approve(self, request_id: str, **fields: Any) -> Request:
        return await self.decide(request_id, outcome(Outcome.approved, **fields))

    async def reject(self, request_id: str, reason: str | None = None, **fields: Any) -> Request:
        return await self.decide(request_id, outcome(Outcome.rejected, reason=reason, **fields))

    async def modify(self, request_id: str, args: dict[str, Any], **fields: Any) -> Request:
        return await self.decide(request_id, outcome(Outcome.modified, args=args, **fields))

    async def answer(self, request_id: str, answer: Any, **fields: Any) -> Request:
        return await self.decide(request_id, outcome(Outcome.answered, answer=answer, **fields))

    async def escalate(
        self, request_id: str, target: str | None = None, reason: str | None = None
    ) -> Request:
        return await self.decide(
            request_id, outcome(Outcome.escalated, target=target, reason=reason)
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
            done = all_done(got) if all else not all_pending(got)
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
        return _results(got)

    async def start_run(
        self, agent: str, prompt: str, *, idempotency_key: str | None = None
    ) -> str:
        return await self._send(self._calls.start_run(agent, prompt, idempotency_key))

    async def get_run(self, run_id: str) -> Run:
        return await self._send(self._calls.get_run(run_id))

    async def stats(self, *, since: str | None = None, until: str | None = None) -> Stats:
        return await self._send(self._calls.stats(since, until))

    async def jwks(self) -> dict[str, Any]:
        """The public keys approval receipts are signed with (no token needed)."""
        return await self._send(self._calls.jwks())

    async def spend_receipt(
        self, request_id: str, tool_name: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """Spend the request's receipt just before running its tool (a `Conflict` with code
        `receipt_refused`: do not run it)."""
        return await self._send(self._calls.spend_receipt(request_id, tool_name, args))

    async def send_prompt(self, run_id: str, prompt: str) -> Run:
        return await self._send(self._calls.send_prompt(run_id, prompt))
