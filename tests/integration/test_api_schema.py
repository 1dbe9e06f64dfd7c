"""Schemathesis against /openapi.json: generated (valid and invalid) calls never get a 5xx,
every JSON error has the `{"error", "detail"}` shape, and every answer is one the document
describes (status code, content type, body schema)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person

ADMIN = "tok-admin"
MAX_EXAMPLES = 30
# /v1/events streams until the client leaves: only its refusals are fuzzed.
STREAMING = {"GET /v1/events"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture
def app_and_broker(redis: Redis) -> tuple[Any, Broker]:
    cfg = parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"], "escalate_to": "managers"},
                "managers": {"channels": ["inbox"]},
            },
            "webhooks": {
                "ops": {
                    "url": "http://127.0.0.1:9/",
                    "secret": "whsec_"
                    + base64.b64encode(b"schemathesis-secret-0123456789ab").decode(),
                }
            },
            "slack": {"bot_token": "xoxb-x", "signing_secret": "sekrit"},
            "email": {"lists": {}},
            "approvers": {"alice": person("tok-alice", ["requester"])},
        }
    )
    broker = Broker(redis, cfg, prefix="t:")
    redis.sadd(broker.keys.agents, "refunds")
    return create_app(Settings(admin_token=ADMIN), cfg, broker), broker


def check_response(label: str, response: Any) -> None:
    assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:500]}"
    if response.status_code >= 400 and "json" in response.headers.get("content-type", ""):
        body = response.json()
        assert set(body) >= {"error", "detail"}, f"{label}: {body}"


def fuzz(operation: Any, broker: Broker, token: str | None, failures: list[str]) -> int:
    """Call `operation` with generated cases; returns how many calls were made.

    Each answer the document does not describe is added to `failures` (one line each)."""
    modes = [GenerationMode.NEGATIVE] if operation.label in STREAMING else list(GenerationMode)
    strategy = st.one_of([operation.as_strategy(generation_mode=m) for m in modes])
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    calls = 0

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, real_id=st.booleans())
    def run(case: Any, real_id: bool) -> None:
        nonlocal calls
        params = case.path_parameters or {}
        if real_id and "request_id" in params:  # reach the decision logic, not just the 404
            fresh = broker.create_request(NewRequest(tool_name="t", args={"a": 1}))
            params["request_id"] = fresh.id
        if real_id and "name" in params:
            params["name"] = "ops"
        if isinstance((case.query or {}).get("wait"), int | float):  # keep long-polls short
            case.query["wait"] = min(case.query["wait"], 0.05)
        if token:  # generated cases may carry their own (bad) Authorization: ours wins
            case.headers = {**(case.headers or {}), **headers}
        response = case.call()
        calls += 1
        check_response(operation.label, response)
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as group:
            for failure in group.exceptions:
                failures.append(f"{operation.label} -> {response.status_code}: {failure.title}")

    run()
    return calls


@pytest.mark.parametrize("token", [None, ADMIN], ids=["anonymous", "admin"])
def test_no_generated_input_gets_a_5xx(
    app_and_broker: tuple[Any, Broker], token: str | None
) -> None:
    app, broker = app_and_broker
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 11
    failures: list[str] = []
    tried = sum(
        fuzz(operation, broker, token, failures)
        for operation in operations
        if not (token and operation.label in STREAMING)
    )
    assert tried > 100
    assert not failures, "\n".join(sorted(set(failures)))
