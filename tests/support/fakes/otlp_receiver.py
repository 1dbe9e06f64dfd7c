"""An OTLP/HTTP trace receiver on loopback: what a collector checks, and the spans it got.

`POST /v1/traces` takes a protobuf `ExportTraceServiceRequest` (as the OpenTelemetry SDK's
OTLP/HTTP exporter sends it), decoded with `opentelemetry-proto`; a body that is not one, or
another content type, gets 400 as a collector answers. Each span is kept flat (`Span` below)
with its service's name, so a test can follow one trace across processes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.fakes._http import QuietHandler, ServerThread

PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[str, ...] = ()  # linked span ids


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    got = getattr(v, which)
    if which == "array_value":
        return [_value(x) for x in got.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in got.values}
    return got


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class _Handler(QuietHandler):
    def do_POST(self) -> None:
        receiver: OtlpReceiver = self.server.owner  # type: ignore[attr-defined]
        body = self.read_body()
        if self.path != "/v1/traces":
            self.reply(404, "not found")
            return
        if (self.headers.get("content-type") or "").split(";")[0].strip() != PROTOBUF:
            self.reply(400, "expected application/x-protobuf")
            return
        try:
            receiver.take(ExportTraceServiceRequest.FromString(body))
        except DecodeError:
            self.reply(400, "not an ExportTraceServiceRequest")
            return
        # an empty ExportTraceServiceResponse (the SDK's exporter reads the status only)
        self.reply(200, ExportTraceServiceResponse().SerializeToString())


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.exports = 0
        self._lock = threading.Lock()
        self._server = ServerThread(_Handler, self)

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def endpoint(self) -> str:
        """For `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter appends `/v1/traces`)."""
        return f"http://127.0.0.1:{self._server.port}"

    def take(self, export: ExportTraceServiceRequest) -> None:
        got: list[Span] = []
        for resource_spans in export.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name"))
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    got.append(
                        Span(
                            service=service,
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes=_attributes(s.attributes),
                            links=tuple(link.span_id.hex() for link in s.links),
                        )
                    )
        with self._lock:
            self.spans.extend(got)
            self.exports += 1

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)
