"""Traces across the fleet: OpenTelemetry set up from `OTEL_*` (`telemetry`) and the spans of an
approval's life (`spans`).
"""
