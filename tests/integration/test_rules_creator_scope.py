"""A person's rule grants no more than its creator may decide: not in a queue whose roles the
creator lacks, not a call the creator asked for (the two-person rule), and no rule naming a
queue the creator may not decide in. Role `policy` keeps its wide rules."""

from __future__ import annotations

from fastapi.testclient import TestClient

from broker.domain.models import NewRequest
from broker.facade import Broker
from tests.support.auth import bearer, person

BOB, PAT = bearer("tok-bob"), bearer("tok-pat")


API_CONFIG = {
    "queues": {
        "default": {"channels": ["inbox"]},
        "finance": {"channels": ["inbox"], "roles": ["finance"]},
    },
    "agents": {"payments": {"path": "refunds_demo:agent"}},
    "approvers": {
        "bob": person("tok-bob", ["ops", "requester"]),
        "pat": person("tok-pat", ["policy"]),
        "fin": person("tok-fin", ["finance"]),
    },
}


def wire(broker: Broker, queue: str = "default", created_by: str = "app") -> str:
    run_id = broker.create_run("payments", "p").id
    new = NewRequest(tool_name="wire", queue=queue, created_by=created_by)
    [req] = broker.create_round(run_id, 1, [new])
    return req.status.value


def test_a_persons_rule_covers_only_what_they_may_decide(
    client: TestClient, api_broker: Broker
) -> None:
    rule = {"effect": "allow", "tool": "wire", "agent": "payments"}
    res = client.post("/v1/rules", json=rule, headers=BOB)
    assert res.status_code == 201, res.text
    assert wire(api_broker) == "approved"  # what bob may decide
    assert wire(api_broker, queue="finance") == "pending"  # bob lacks the queue's role
    assert wire(api_broker, created_by="bob") == "pending"  # bob's own call


def test_a_rule_naming_a_queue_needs_its_roles(client: TestClient, api_broker: Broker) -> None:
    rule = {"effect": "allow", "tool": "wire", "agent": "payments", "queue": "finance"}
    res = client.post("/v1/rules", json=rule, headers=BOB)
    assert res.status_code == 403, res.text
    assert client.post("/v1/rules", json=rule, headers=PAT).status_code == 201
    assert wire(api_broker, queue="finance", created_by="pat") == "approved"  # policy's rule


def test_rules_are_read_by_policy_or_their_creator(client: TestClient) -> None:
    mine = client.post(
        "/v1/rules", json={"effect": "allow", "tool": "wire", "agent": "payments"}, headers=BOB
    ).json()
    fin = bearer("tok-fin")
    assert client.get("/v1/rules", headers=fin).json() == []
    assert client.get(f"/v1/rules/{mine['id']}", headers=fin).status_code == 404
    assert [r["id"] for r in client.get("/v1/rules", headers=BOB).json()] == [mine["id"]]
    assert client.get(f"/v1/rules/{mine['id']}", headers=PAT).status_code == 200
