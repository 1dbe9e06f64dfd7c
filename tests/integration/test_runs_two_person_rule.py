"""The two-person rule for agent runs: whoever started a run over the API asked for its calls,
so their approval of one is refused (403 `creator_may_not_approve`); another approver's counts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import wait_run
from tests.support.auth import bearer_by_name, person
from tests.support.jobs import jobs_bound_to, work

DEMO = "refunds_demo:agent"
TOKENS = {"svc": "tok-svc-fixups-0123456789", "bob": "tok-bob-fixups-0123456789"}


auth = bearer_by_name(TOKENS)


API_CONFIG = {
    "queues": {"default": {"channels": ["inbox"], "timeout_s": 600}},
    "approvers": {
        # svc starts runs and holds an approver's role too: only the rule stops it
        "svc": person(TOKENS["svc"], ["requester", "ops"]),
        "bob": person(TOKENS["bob"], ["ops"]),
    },
}


@pytest.fixture
def fleet(api_broker: Broker) -> Iterator[Broker]:
    register_agent(api_broker, "refunds", DEMO, deps="refunds_demo:make_deps", max_rounds=3)
    with jobs_bound_to(api_broker):
        yield api_broker


def start_and_pause(client: TestClient, broker: Broker, headers: dict[str, str]) -> str:
    """Start the demo agent over the API; run its first round; the id of its one request."""
    body = {"agent": "refunds", "prompt": "Refund $120 on order A103 because the floor is torn."}
    resp = client.post("/v1/runs", json=body, headers=headers)
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["run_id"]
    assert broker.run_fields(run_id)["started_by"] == "svc"
    work(broker)
    run = wait_run(broker, run_id, until=(RunStatus.waiting, RunStatus.failed))
    assert run.status is RunStatus.waiting, run.error
    [request_id] = run.pending
    return request_id


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "idempotency-key"])
def test_the_runs_starter_may_not_approve_its_call_and_another_approver_may(
    client: TestClient, fleet: Broker, keyed: bool
) -> None:
    headers = auth("svc") | ({"Idempotency-Key": "run-once-1"} if keyed else {})
    request_id = start_and_pause(client, fleet, headers)
    assert fleet.get_request(request_id).created_by == "svc"

    refused = client.post(
        f"/v1/requests/{request_id}/decision", json={"outcome": "approved"}, headers=auth("svc")
    )
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == "creator_may_not_approve"
    assert fleet.get_request(request_id).status.value == "pending"

    ok = client.post(
        f"/v1/requests/{request_id}/decision", json={"outcome": "approved"}, headers=auth("bob")
    )
    assert ok.status_code == 200, ok.text
    decided = fleet.get_request(request_id)
    assert decided.status.value == "approved" and decided.decision
    assert decided.decision.decided_by == "bob"


def test_a_run_started_without_the_api_has_no_creator(api_broker: Broker) -> None:
    from broker.runs.starting import start_run

    register_agent(api_broker, "refunds", DEMO, deps="refunds_demo:make_deps")
    run = start_run(api_broker, "refunds", "hi")
    assert "started_by" not in api_broker.run_fields(run.id)
