"""Tracing is off unless the `OTEL_*` environment names an exporter, and off it costs nothing.

Off (this test process has no `OTEL_*`): no tracer provider, exporter or thread is set up, `span()` is one shared
no-op, a request's hash gets no `traceparent` field and the outbox entry of a resume none either.
What tracing does when on is proven across real processes in tests/system/test_tracing_fleet.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from opentelemetry import trace

from broker.domain.models import Decision, NewRequest
from broker.facade import Broker
from broker.tracing import telemetry as tracing
from broker.tracing.spans import decided_by_kind, field_of


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_traces_are_wanted_only_when_an_otlp_exporter_is_configured(
    env: dict[str, str], wanted: bool
) -> None:
    assert tracing.wanted(env) is wanted


def test_off_the_helpers_are_shared_no_ops() -> None:
    assert not tracing.enabled()
    assert tracing.span("a") is tracing.span("b", parent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    with tracing.span("a") as current:
        assert current is None
    assert tracing.traceparent() is None
    assert tracing.headers() == {}
    assert tracing.now_ns() == 0

    async def answer() -> int:
        return 42

    coro = answer()
    assert tracing.carry(coro) is coro
    assert asyncio.run(coro) == 42


def test_a_role_without_otel_environment_sets_up_no_provider_exporter_or_thread() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import sys, threading\n"
        "from opentelemetry import trace\n"
        "from broker.tracing import telemetry as tracing\n"
        "import approval_broker.cli_roles, notifiers.dispatch, broker.runs.agent_runner, api.app\n"
        "assert tracing.configure('api') is False\n"
        "assert type(trace.get_tracer_provider()).__name__ == 'ProxyTracerProvider'\n"
        "assert 'opentelemetry.exporter.otlp.proto.http.trace_exporter' not in sys.modules\n"
        "assert [t.name for t in threading.enumerate()] == ['MainThread']\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_unsupported_otlp_protocol_leaves_tracing_off_with_a_warning() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    code = "from broker.tracing import telemetry as tracing\nassert tracing.configure('worker') is False\n"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "not supported" in done.stderr


def test_off_a_request_and_its_resume_carry_no_trace_field(broker: Broker) -> None:
    run = broker.create_run("agent", "go")
    (request,) = broker.create_round(run.id, 1, [NewRequest(tool_name="refund", args={"n": 1})])
    assert b"traceparent" not in broker.redis.hgetall(broker.keys.request(request.id))
    broker.decide(request.id, Decision(outcome="approved"), decided_by="alice")
    entries = broker.redis.xrange(broker.keys.part(0).resumes)
    assert entries and all(b"traceparent" not in fields for _, fields in entries)


def test_off_fastapi_asks_opentelemetry_for_no_provider_per_request(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastAPI's native telemetry, left on, looks up the global tracer provider on every request
    (and the meter and logger providers) only to find none set: off, it is not asked at all."""
    asked: list[str] = []
    real = trace.get_tracer_provider

    def counted() -> trace.TracerProvider:
        asked.append("tracer")
        return real()

    monkeypatch.setattr(trace, "get_tracer_provider", counted)
    for _ in range(3):
        assert client.get("/healthz").status_code == 200
    assert asked == []


def test_fastapi_telemetry_is_on_exactly_when_traces_are_wanted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With `OTEL_*` asking for traces, FastAPI's native telemetry stays on (its `POST /v1/runs`
    spans are the roots of a traced fleet's traces: tests/system/test_tracing_fleet.py); without, off."""
    from api.app import fastapi_telemetry

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert fastapi_telemetry() == {"tracing": True, "metrics": True, "logs": True}
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    assert fastapi_telemetry() == {"tracing": False, "metrics": False, "logs": False}


def test_a_traceparent_that_does_not_parse_names_no_parent() -> None:
    assert tracing.context_of("not-a-traceparent") is None
    assert tracing.context_of("00-" + "0" * 32 + "-" + "0" * 16 + "-01") is None  # invalid ids
    assert tracing.context_of(None) is None


def test_who_decided_is_told_by_kind() -> None:
    assert decided_by_kind("alice") == "person"
    assert decided_by_kind("rule:refunds-under-50") == "rule"
    assert decided_by_kind("webhook:ops") == "webhook"
    assert decided_by_kind(None) == "system"


def test_a_field_is_read_from_a_steps_flat_reply() -> None:
    flat = [b"id", b"r1", b"traceparent", b"00-abc", "queue", "default"]
    assert field_of(flat, "traceparent") == "00-abc"
    assert field_of(flat, "queue") == "default"
    assert field_of(flat, "missing") is None
