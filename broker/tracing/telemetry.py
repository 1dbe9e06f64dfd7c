"""Traces across the fleet: OpenTelemetry set up from the standard `OTEL_*` environment.

Why one module: every role (api, worker, resumer, notifier, sweeper) calls `configure(role)` at
start, and the code on the path of a request (creating it, delivering it, deciding it, resuming
its run, running its tool) opens spans through `span()` and carries the context between
processes as a W3C `traceparent` string: on the request's hash, on the outbox entry of a
resume, in an RQ job's meta, and on an outbound webhook's headers.

Off unless an exporter is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_TRACES_EXPORTER=otlp`): then the SDK is never
imported, `span()` hands back one shared no-op context manager and `traceparent()` None, so
tracing costs a function call and a test of one global (bench/bench_tracing.py measures it).
Exporting never blocks a role: spans go through the SDK's `BatchSpanProcessor` (a bounded
queue that drops when full, `OTEL_BSP_MAX_QUEUE_SIZE`) to the OTLP/HTTP exporter (timeout
`OTEL_EXPORTER_OTLP_TIMEOUT`, default here 5 s), so a collector that is down costs dropped
spans only; at exit the flush is given `SHUTDOWN_S` at most.

It must never decide anything, raise into the code it traces, or read Redis.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("broker.tracing.telemetry")

__all__ = [
    "SHUTDOWN_S",
    "SpanKind",
    "carry",
    "configure",
    "configured",
    "context_of",
    "enabled",
    "headers",
    "now_ns",
    "set_error",
    "shutdown",
    "span",
    "traceparent",
    "wanted",
]

SHUTDOWN_S = 2.0
"""How long a role's exit waits for the last spans to leave (a collector that is down would
otherwise hold the exit for the exporter's whole retry budget)."""
DEFAULT_TIMEOUT_S = 5.0
"""The exporter's timeout when no `OTEL_EXPORTER_OTLP_*TIMEOUT` says otherwise."""
TRACEPARENT = "traceparent"

_T = TypeVar("_T")
_tracer: Tracer | None = None
_provider: Any = None
_lock = threading.Lock()
_OFF: AbstractContextManager[None] = contextlib.nullcontext()
_propagator = TraceContextTextMapPropagator()


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the `OTEL_*` environment asks for traces: an OTLP endpoint or exporter named, and
    neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter == "otlp"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def enabled() -> bool:
    return _tracer is not None


def configure(role: str) -> bool:
    """Set up tracing for this process from the environment (once); True when it is on.

    `role` names the process (`service.name` is `approval-broker-{role}` unless
    `OTEL_SERVICE_NAME` says otherwise). Agents run by this process are instrumented too
    (pydantic-ai's `Agent.instrument_all`), without message content unless
    `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.
    """
    global _tracer, _provider
    with _lock:
        if _tracer is not None:
            return True
        if not wanted():
            return False
        exporter = _env("OTEL_TRACES_EXPORTER").lower()
        protocol = (
            _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _env("OTEL_EXPORTER_OTLP_PROTOCOL")
        ).lower()
        if protocol and protocol != "http/protobuf":
            log.warning(
                "tracing is off: OTLP protocol %r is not supported (use http/protobuf)", protocol
            )
            return False
        if exporter and exporter != "otlp":  # pragma: no cover - `wanted` said no already
            return False
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from pydantic_ai import Agent, InstrumentationSettings

        attributes: dict[str, str] = {"approval.role": role}
        if not _env("OTEL_SERVICE_NAME"):
            attributes["service.name"] = f"approval-broker-{role}"
        timeout = None
        if not (_env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or _env("OTEL_EXPORTER_OTLP_TIMEOUT")):
            timeout = DEFAULT_TIMEOUT_S
        provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=timeout)))
        trace.set_tracer_provider(provider)
        content = _env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT").lower() == "true"
        Agent.instrument_all(
            InstrumentationSettings(tracer_provider=provider, include_content=content)
        )
        _provider = provider
        _tracer = provider.get_tracer("approval_broker")
        atexit.register(shutdown)
        log.info("tracing on for %s", role)
        return True


def shutdown(timeout_s: float = SHUTDOWN_S) -> None:
    """Flush and stop, waiting `timeout_s` at most (the export thread is a daemon)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is None:
        return
    closing = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
    closing.start()
    closing.join(timeout_s)


def context_of(parent: str | None) -> otel_context.Context | None:
    """The context a `traceparent` names (None for none, or one that doesn't parse)."""
    if not parent:
        return None
    ctx = _propagator.extract({TRACEPARENT: parent})
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def span(
    name: str,
    *,
    parent: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    start_ns: int | None = None,
    link_current: bool = False,
) -> AbstractContextManager[Span | None]:
    """A span made current for the block, or a shared no-op when tracing is off.

    `parent` (a `traceparent`) makes the span a child of that context (the request's trace)
    instead of the current one; with `link_current` the current span is linked to it (the HTTP
    call that carried a decision, say). None attribute values are left out. An exception
    leaving the block is recorded on the span and raised as is.
    """
    tracer = _tracer
    if tracer is None:
        return _OFF
    ctx = context_of(parent) if parent else None
    links = None
    if link_current and ctx is not None:
        current = trace.get_current_span().get_span_context()
        links = [Link(current)] if current.is_valid else None
    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    return tracer.start_as_current_span(
        name, context=ctx, kind=kind, attributes=attrs, links=links, start_time=start_ns
    )


def set_error(current: Span | None, description: str) -> None:
    """Mark a span as failed (a delivery that will be retried, a refused step)."""
    if current is not None:
        current.set_status(Status(StatusCode.ERROR, description[:500]))


def now_ns() -> int:
    """A span start time taken before the work it will cover (0 when tracing is off)."""
    return time.time_ns() if _tracer is not None else 0


def traceparent() -> str | None:
    """The current span's `traceparent`, to store beside the work it starts (None when off)."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get(TRACEPARENT)


def headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`) for an outbound HTTP call; empty when off."""
    if _tracer is None:
        return {}
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier


def carry(coro: Coroutine[Any, Any, _T]) -> Coroutine[Any, Any, _T]:
    """`coro`, run in the context current here, wherever it is awaited (the worker runs agents
    on one shared event loop in another thread, whose tasks would not see this context)."""
    if _tracer is None:
        return coro
    ctx = otel_context.get_current()
    return _in_context(ctx, coro)


async def _in_context(ctx: otel_context.Context, coro: Coroutine[Any, Any, _T]) -> _T:
    token = otel_context.attach(ctx)
    try:
        return await coro
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def configured(role: str) -> Iterator[bool]:
    """`configure(role)` for the life of a role's process, flushed when it ends."""
    on = configure(role)
    try:
        yield on
    finally:
        if on:
            shutdown()
