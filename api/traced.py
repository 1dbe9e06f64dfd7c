"""The API's server spans: the calls that start an approval's trace (`broker.tracing`).

Why only these: a trace follows one approval from the call that made it (`POST /v1/runs`,
`POST /v1/requests`) through its deliveries, decision, resume and tool run; the decision's own
span joins that trace wherever the reply came from (`broker.traced.decision`). A caller's
`traceparent` header is honoured, so an app's own trace goes on through the broker.
A no-op when tracing is off.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from fastapi import Request as HttpRequest
from opentelemetry.trace import Span

from broker import tracing
from broker.tracing import SpanKind


def server_span(http: HttpRequest, route: str) -> AbstractContextManager[Span | None]:
    """`POST {route}`, a server span, child of the caller's `traceparent` if it sent one."""
    if not tracing.enabled():
        return tracing.span(route)  # the shared no-op
    return tracing.span(
        f"{http.method} {route}",
        parent=http.headers.get(tracing.TRACEPARENT),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": http.method, "http.route": route},
    )
