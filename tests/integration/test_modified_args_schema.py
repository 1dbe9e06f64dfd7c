"""`modified` args must meet the tool's argument schema, stored with the request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from broker.domain.config import Config
from broker.domain.errors import InvalidInput
from broker.domain.models import Decision, Outcome
from broker.domain.principals import Principal
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.judge import Judge
from broker.runs.agents import register_agent
from broker.runs.starting import start_run
from tests.support.auth import person
from tests.support.jobs import work

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": "number", "maximum": 500},
        "note": {"type": "object", "properties": {"lang": {"enum": ["en", "de"]}}},
    },
    "required": ["order_id", "amount"],
    "additionalProperties": False,
}
AGENT = {"Authorization": "Bearer tok-agent"}
ALICE = {"Authorization": "Bearer tok-alice"}


API_CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "approvers": {
        "agent": person("tok-agent", ["requester"]),
        "alice": person("tok-alice", ["finance"]),
    },
}


@pytest.fixture
def client(api_broker: Broker, cfg: Config) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(), cfg, api_broker)) as c:
        yield c


def create(client: TestClient, **extra: Any) -> dict[str, Any]:
    body = {"tool_name": "refund", "args": {"order_id": "A1", "amount": 120}, **extra}
    resp = client.post("/v1/requests", json=body, headers=AGENT)
    assert resp.status_code in (200, 201), resp.text
    return resp.json()


def modify(client: TestClient, rid: str, args: dict[str, Any]) -> Any:
    return client.post(
        f"/v1/requests/{rid}/decision", json={"outcome": "modified", "args": args}, headers=ALICE
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"order_id": "A1", "amount": "lots"}, "args.amount"),
        ({"order_id": "A1", "amount": 9000}, "args.amount"),
        ({"order_id": "A1"}, "args.amount"),
        ({"order_id": "A1", "amount": 1, "tip": 5}, "args.tip"),
        ({"order_id": "A1", "amount": 1, "note": {"lang": "fr"}}, "args.note.lang"),
    ],
)
def test_modified_args_that_break_the_schema_are_422_naming_the_field_and_nothing_is_written(
    client: TestClient, api_broker: Broker, args: dict[str, Any], field: str
) -> None:
    made = create(client, args_schema=SCHEMA)
    assert made["args_schema"] == SCHEMA
    before = api_broker.redis.hgetall(api_broker.keys.request(made["id"]))
    resp = modify(client, made["id"], args)
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["error"] == "invalid_args"
    assert f"{field}:" in body["detail"], body["detail"]
    assert api_broker.redis.hgetall(api_broker.keys.request(made["id"])) == before


def test_modified_args_that_meet_the_schema_are_recorded(
    client: TestClient, api_broker: Broker
) -> None:
    made = create(client, args_schema=SCHEMA)
    args = {"order_id": "A1", "amount": 80.5, "note": {"lang": "de"}}
    resp = modify(client, made["id"], args)
    assert resp.status_code == 200, resp.text
    stored = api_broker.get_request(made["id"])
    assert stored.status.value == "modified" and stored.decision is not None
    assert stored.decision.args == args
    assert client.get(f"/v1/requests/{made['id']}", headers=ALICE).json()["args_schema"] == SCHEMA


def test_without_a_schema_any_args_are_taken(client: TestClient, api_broker: Broker) -> None:
    made = create(client)
    assert made["args_schema"] is None
    assert modify(client, made["id"], {"anything": [1, 2]}).status_code == 200


@pytest.mark.parametrize(
    "schema",
    [{"type": "objekt"}, {"type": "array"}, {"properties": {"a": {"type": 5}}}],
)
def test_a_schema_that_is_not_one_is_refused_at_creation(
    client: TestClient, api_broker: Broker, schema: dict[str, Any]
) -> None:
    body = {"tool_name": "refund", "args": {}, "args_schema": schema}
    resp = client.post("/v1/requests", json=body, headers=AGENT)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"] == "invalid_schema"
    assert api_broker.list_requests() == []


def test_a_request_from_a_real_agent_run_carries_the_tools_schema(bound: Broker) -> None:
    register_agent(bound, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
    run = start_run(bound, "refunds", "Refund $120 on order A103 because the floor is torn.")
    work(bound)
    [rid] = bound.get_run(run.id).pending
    request = bound.get_request(rid)
    schema = request.args_schema
    assert schema is not None and request.tool_name == "issue_refund"
    assert set(schema["properties"]) == {"order_id", "amount", "reason"}
    assert schema["properties"]["amount"]["type"] == "number"
    assert set(schema["required"]) == {"order_id", "amount", "reason"}
    # ... and is held to it
    judge = Judge(bound)
    alice = Principal("alice", frozenset({"finance"}))
    bad = Decision(outcome=Outcome.modified, args={**request.args, "amount": "120"})
    with pytest.raises(InvalidInput) as exc:
        judge.decide(rid, bad, alice, via=["inbox"])
    assert exc.value.code == "invalid_args" and "args.amount" in exc.value.detail
    good = Decision(outcome=Outcome.modified, args={**request.args, "amount": 60.0})
    assert judge.decide(rid, good, alice, via=["inbox"]).recorded
