"""The spans of an approval's life, named and attributed in one place (`broker.tracing.telemetry` makes them).

Why apart from `broker.tracing.telemetry`: that module is the OpenTelemetry plumbing; this one knows the
domain (a decision, an RQ job of a run, a resume enqueued), and gives every span the same
attribute names: the GenAI semantic conventions where they exist (`gen_ai.tool.name`,
`gen_ai.tool.call.id`), OpenTelemetry's messaging ones for RQ jobs, and `approval.*` for the
rest (`approval.outcome`, `approval.decided_by.kind`, `approval.queue`, `approval.rule`,
`approval.request.id`, `approval.run.id`, `approval.round`, `approval.channel`).

Each helper is a no-op when tracing is off; none raises into the step it describes, and
only `swept` reads Redis (the requests' traces, while tracing is on).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from opentelemetry.trace import Span
from redis.exceptions import RedisError

from broker.domain.models import Decision, Request
from broker.redis.replies import as_str
from broker.tracing import telemetry as tracing
from broker.tracing.telemetry import SpanKind


class Swept(Protocol):
    """What the sweeper did to one request, as a span records it (`broker.store.sweeping.SweepResult`)."""

    @property
    def request_id(self) -> str: ...
    @property
    def action(self) -> str: ...
    @property
    def from_queue(self) -> str: ...
    @property
    def to_queue(self) -> str | None: ...


class ReadsRequests(Protocol):
    """Where a request's `traceparent` is read: a Redis client and the key schema (a `Broker`).

    Protocols rather than the classes: the services that record spans are what `Broker` and
    the sweeper are built from, so naming them here would make the modules import each other."""

    @property
    def redis(self) -> Any: ...
    @property
    def keys(self) -> Any: ...


log = logging.getLogger("broker.tracing.spans")

RUN_QUEUE = (
    "agent-runs"  # the RQ queue's name (`broker.runs.starting.RUN_QUEUE`; not imported: a cycle)
)


def decided_by_kind(decided_by: str | None) -> str:
    """`person` | `rule` | `webhook` | `system`, from a recorded `decided_by`."""
    if not decided_by:
        return "system"
    head = decided_by.split(":", 1)[0]
    if head in ("rule", "webhook"):
        return head
    if head in ("system", "sweeper", "broker"):
        return "system"
    return "person"


def field_of(flat: list[Any], name: str) -> str | None:
    """A field of a Lua step's HGETALL reply (field, value, field, value...), as text."""
    for i in range(0, len(flat) - 1, 2):
        key = flat[i]
        if key == name or key == name.encode():
            value = flat[i + 1]
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def decision(
    fields: list[Any],
    request: Request,
    outcome: str,
    decided_by: str,
    channel: str | None,
    started_ns: int,
) -> None:
    """One span for a recorded decision (or vote), in the trace the request was made in, and
    linked to the call that carried it (an HTTP request, a Slack click)."""
    parent = field_of(fields, tracing.TRACEPARENT)
    _decision_span(request, outcome, decided_by, channel, started_ns, parent)


def escalation(
    fields: list[Any], request: Request, by: str, *, from_queue: str, started_ns: int
) -> None:
    """One span for a request a person (or a channel) escalated, in the trace it was made in:
    the sweeper's escalations have theirs in `swept`."""
    with tracing.span(
        "approval.escalation",
        parent=field_of(fields, tracing.TRACEPARENT),
        start_ns=started_ns,
        link_current=True,
        attributes={
            "approval.outcome": "escalated",
            "approval.decided_by.kind": decided_by_kind(by),
            "approval.queue": from_queue,
            "approval.queue.to": request.queue,
            "approval.request.id": request.id,
            "approval.run.id": request.run_id,
            "gen_ai.tool.name": request.tool_name,
            "gen_ai.tool.call.id": request.tool_call_id,
        },
    ):
        pass


def ruled(requests: list[Request]) -> None:
    """A span for each request a rule decided as it was made, in the trace that made it."""
    for request in requests:
        made = request.decision
        if made is not None and tracing.enabled():
            by = made.decided_by or ""
            _decision_span(request, made.outcome.value, by, None, None, None)


def _decision_span(
    request: Request,
    outcome: str,
    decided_by: str,
    channel: str | None,
    started_ns: int | None,
    parent: str | None,
) -> None:
    rule = decided_by.split(":", 1)[1] if decided_by.startswith("rule:") else None
    with tracing.span(
        "approval.decision",
        parent=parent,
        start_ns=started_ns,
        link_current=True,
        attributes={
            "approval.outcome": outcome,
            "approval.decided_by.kind": decided_by_kind(decided_by),
            "approval.queue": request.queue,
            "approval.rule": rule,
            "approval.channel": channel,
            "approval.request.id": request.id,
            "approval.run.id": request.run_id,
            "approval.status": request.status.value,
            "gen_ai.tool.name": request.tool_name,
            "gen_ai.tool.call.id": request.tool_call_id,
        },
    ):
        pass


def outcome_of(decision: Decision, code: str) -> str:
    """What a decide step did: the outcome, or `voted` for a vote below the quorum."""
    return "voted" if code == "voted" else decision.outcome.value


def job(job_meta: dict[str, Any] | None, job_id: str | None, run_id: str, round_no: int) -> AbstractContextManager[Span | None]:  # fmt: skip
    """The span of an RQ job advancing a run (`process agent-runs`), a child of whatever
    enqueued it (its meta's `traceparent`): the run's start, or the round's resume."""
    parent = (job_meta or {}).get(tracing.TRACEPARENT) if tracing.enabled() else None
    return tracing.span(
        f"process {RUN_QUEUE}",
        parent=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "rq",
            "messaging.operation.type": "process",
            "messaging.destination.name": RUN_QUEUE,
            "messaging.message.id": job_id,
            "approval.run.id": run_id,
            "approval.round": round_no,
        },
    )


def job_meta(run_id: str, round_no: int, parent: str | None = None) -> dict[str, Any] | None:
    """RQ meta carrying the trace to a job's worker: a `send agent-runs` span (under `parent`,
    the outbox entry's `traceparent`, else the current span) whose context the job continues.
    None when tracing is off, or when there is nothing to continue."""
    if not tracing.enabled():
        return None
    if parent is None and tracing.traceparent() is None:
        return None
    with tracing.span(
        f"send {RUN_QUEUE}",
        parent=parent,
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rq",
            "messaging.operation.type": "send",
            "messaging.destination.name": RUN_QUEUE,
            "approval.run.id": run_id,
            "approval.round": round_no,
        },
    ):
        carried = tracing.traceparent()
    return {tracing.TRACEPARENT: carried} if carried else None


def swept(broker: ReadsRequests, results: Sequence[Swept], started_ns: int) -> None:
    """A span per request the sweeper timed out or escalated, each in its request's trace.

    The requests' `traceparent`s take one pipelined read, made only while tracing is on; a read
    that fails costs the spans, never the sweep."""
    if not results or not tracing.enabled():
        return
    try:
        pipe = broker.redis.pipeline(transaction=False)
        for result in results:
            pipe.hget(broker.keys.request(result.request_id), tracing.TRACEPARENT)
        parents = pipe.execute()
    except RedisError:
        log.warning("sweep: the requests' traces could not be read", exc_info=True)
        return
    for result, parent in zip(results, parents, strict=True):
        with tracing.span(
            "approval.timeout" if result.action == "timed_out" else "approval.escalation",
            parent=as_str(parent) if parent else None,
            start_ns=started_ns,
            attributes={
                "approval.outcome": result.action,
                "approval.decided_by.kind": "system",
                "approval.queue": result.from_queue,
                "approval.queue.to": result.to_queue,
                "approval.request.id": result.request_id,
            },
        ):
            pass
