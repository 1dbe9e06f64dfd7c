"""REST under generated input (schemathesis against the app's own /openapi.json, in process):
no call gets a 5xx, and a write its caller may not make changes nothing in Redis.

Three callers that may write little or nothing: no token at all (every route refuses it, or
checks a signature it doesn't have: Slack, Telegram, Discord, Teams, webhook replies, email
links), an `auditor` (reads everything, decides nothing) and an agent with only `requester`
(asks; never decides, acks, spends a receipt or makes a rule). Path parameters are the seeded
requests' ids half the time, so the calls reach the decision logic and not just its 404.
Bounded: `MAX_EXAMPLES` cases per operation and caller (`test_api_schema.py` fuzzes the admin).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis
from schemathesis import GenerationMode

from api.app import create_app
from broker.domain.config import parse_config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import person
from tests.support.decisions import snapshot

MAX_EXAMPLES = 8
AUDITOR, AGENT = "tok-auditor-rest-fuzz", "tok-agent-rest-fuzz"
SECRET = "whsec_" + base64.b64encode(b"rest-fuzz-secret-0123456789abcde").decode()
STREAMING = {"GET /v1/events"}  # streams until the client leaves: refusals only
READS = {"POST /v1/requests/wait"}  # a POST that only reads
MAY_WRITE = {AGENT: {"POST /v1/requests", "POST /v1/runs"}}  # what a requester may do


@pytest.fixture
def app_and_broker(redis: Redis) -> tuple[Any, Broker, list[str]]:
    cfg = parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox", "webhook:ops"], "escalate_to": "managers"},
                "managers": {"channels": ["inbox"]},
                "pair": {"channels": ["inbox", "webhook:ops"], "quorum": 2},
            },
            "webhooks": {"ops": {"url": "http://127.0.0.1:9/", "secret": SECRET}},
            "slack": {"bot_token": "xoxb-x", "signing_secret": "sekrit"},
            "email": {"lists": {}},
            "approvers": {
                "audrey": person(AUDITOR, ["auditor"]),
                "agent": person(AGENT, ["requester"]),
                "alice": person("tok-alice-rest-fuzz", ["finance"]),
            },
        }
    )
    broker = Broker(redis, cfg, prefix="t:")
    redis.sadd(broker.keys.agents, "refunds")
    seeded = [
        broker.create_request(NewRequest(tool_name="t", args={"a": 1})).id,
        broker.create_request(NewRequest(tool_name="t", args={"a": 2}, queue="pair")).id,
        broker.create_request(NewRequest(tool_name="t", args={"a": 3}, created_by="agent")).id,
    ]
    return create_app(Settings(admin_token="tok-admin-rest-fuzz"), cfg, broker), broker, seeded


def fuzz(operation: Any, redis: Redis, token: str | None, seeded: list[str]) -> list[str]:
    """Call `operation` with generated cases as `token`; each problem found is one line."""
    label = operation.label
    modes = [GenerationMode.NEGATIVE] if label in STREAMING else list(GenerationMode)
    strategy = st.one_of([operation.as_strategy(generation_mode=m) for m in modes])
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    refused_write = label not in READS and not label.startswith("GET ")
    refused_write = refused_write and label not in MAY_WRITE.get(token or "", set())
    problems: list[str] = []

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, pick=st.sampled_from([None, *seeded]))
    def run(case: Any, pick: str | None) -> None:
        params = case.path_parameters or {}
        if pick and "request_id" in params:
            params["request_id"] = pick
        if pick and "name" in params:
            params["name"] = "ops"
        if isinstance((case.query or {}).get("wait"), int | float):  # keep long-polls short
            case.query["wait"] = min(case.query["wait"], 0.05)
        case.headers = {**(case.headers or {}), **headers}  # ours wins over a generated one
        if not token:
            case.headers.pop("Authorization", None)
        before = snapshot(redis) if refused_write else None
        response = case.call()
        if response.status_code >= 500:
            problems.append(f"{label} -> {response.status_code}: {response.text[:200]}")
        elif before is not None and response.status_code < 400:
            problems.append(f"{label} -> {response.status_code}: a refused write was accepted")
        elif before is not None and snapshot(redis) != before:
            problems.append(f"{label} -> {response.status_code}: refused, yet Redis changed")

    run()
    return problems


@pytest.mark.parametrize("token", [None, AUDITOR, AGENT], ids=["anonymous", "auditor", "agent"])
def test_no_generated_call_gets_a_5xx_or_changes_state_it_may_not(
    app_and_broker: tuple[Any, Broker, list[str]], token: str | None
) -> None:
    app, broker, seeded = app_and_broker
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    problems = [
        problem
        for operation in operations
        if not (token and operation.label in STREAMING)
        for problem in fuzz(operation, broker.redis, token, seeded)
    ]
    assert not problems, "\n".join(sorted(set(problems)))
    for request_id in seeded:  # still pending, no votes
        stored = broker.get_request(request_id)
        assert stored.is_pending and stored.approvals == [], request_id
