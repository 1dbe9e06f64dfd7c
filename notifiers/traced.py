"""The span of one delivery attempt, in the trace its request was made in (`broker.tracing.telemetry`).

Why here: the notifier is where a request meets each channel; its span (`deliver CHANNEL`)
is a child of the request's stored `traceparent`, so every delivery shows in the approval's
trace, and an outbound webhook carries that context on (`traceparent` header, set by
`channels.webhook.sender` from the current span). A no-op when tracing is off.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from opentelemetry.trace import Span

from broker.tracing import telemetry as tracing
from broker.tracing.telemetry import SpanKind
from notifiers.tasks import Task


def delivery_span(task: Task, channel_kind: str) -> AbstractContextManager[Span | None]:
    """`deliver CHANNEL` for one attempt; an exception leaving it (a retry, a give-up) marks
    the span failed."""
    if not tracing.enabled():
        return tracing.span(task.channel)  # the shared no-op
    entry = task.entry
    stored = entry.stored
    request = entry.request
    return tracing.span(
        f"deliver {task.channel}",
        parent=stored.traceparent if stored is not None else None,
        kind=SpanKind.PRODUCER,
        attributes={
            "approval.channel": task.channel,
            "approval.channel.kind": channel_kind,
            "approval.event": task.event.type,
            "approval.queue": task.event.queue,
            "approval.request.id": task.event.request_id,
            "approval.delivery.attempt": task.attempts + 1,
            "gen_ai.tool.name": request.tool_name if request is not None else None,
            "gen_ai.tool.call.id": request.tool_call_id if request is not None else None,
        },
    )
