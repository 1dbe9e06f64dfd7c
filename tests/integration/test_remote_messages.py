"""A new prompt instead of answers (`POST /v1/runs/{run_id}/messages`): the waiting calls are
rejected with "The user did not answer" by the caller, and the run goes on with the prompt;
an agent with `unanswered = "raise"` refuses with 409."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from broker.domain.models import RunStatus
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.starting import start_run
from broker.testing import SyncWorker
from tests.support.auth import person
from tests.support.chat_agent import executed

REQUESTER = {"Authorization": "Bearer tok-app"}
APPROVER = {"Authorization": "Bearer tok-alice"}


_CHAT = "tests.support.chat_agent:chat_agent"  # the module whose `executed` this test reads
API_CONFIG = {
    "approvers": {
        "app": person("tok-app", ["requester"]),
        "alice": person("tok-alice", ["finance"]),
    },
    "agents": {"chat": {"path": _CHAT}, "strict": {"path": _CHAT, "unanswered": "raise"}},
}


@pytest.fixture
def api_settings() -> Settings:
    return Settings()


def waiting_run(broker: Broker, agent: str) -> str:
    run = start_run(broker, agent, "Refund $120", started_by="app")
    SyncWorker(broker).work()
    assert broker.get_run(run.id).status is RunStatus.waiting
    return run.id


def test_a_new_prompt_rejects_the_waiting_calls_and_goes_on(
    client: TestClient, api_broker: Broker
) -> None:
    executed.clear()
    run_id = waiting_run(api_broker, "chat")
    [rid] = api_broker.get_run(run_id).pending
    resp = client.post(
        f"/v1/runs/{run_id}/messages", json={"prompt": "Forget it, what's the weather?"},
        headers=REQUESTER,
    )  # fmt: skip
    assert resp.status_code == 202, resp.text
    request = api_broker.get_request(rid)
    assert request.status == "rejected"
    assert request.decision and request.decision.reason == "The user did not answer"
    assert request.decision.decided_by == "app"
    SyncWorker(api_broker).work()  # the resume job, exactly as after any decision
    run = api_broker.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    assert run.output == 'tool: The user did not answer | user: ["Forget it, what\'s the weather?"]'
    assert executed == []
    # once it ended there is nothing to answer
    again = client.post(f"/v1/runs/{run_id}/messages", json={"prompt": "hi"}, headers=REQUESTER)
    assert again.status_code == 409 and again.json()["error"] == "not_waiting"


def test_an_agent_that_must_be_answered_refuses(client: TestClient, api_broker: Broker) -> None:
    run_id = waiting_run(api_broker, "strict")
    resp = client.post(f"/v1/runs/{run_id}/messages", json={"prompt": "hi"}, headers=REQUESTER)
    assert resp.status_code == 409 and resp.json()["error"] == "unanswered_raise"
    [rid] = api_broker.get_run(run_id).pending
    assert api_broker.get_request(rid).status == "pending"  # nothing was touched
    assert "prompt:1" not in api_broker.run_fields(run_id)


def test_bad_input_and_roles(client: TestClient, api_broker: Broker) -> None:
    run_id = waiting_run(api_broker, "chat")
    url = f"/v1/runs/{run_id}/messages"
    assert client.post(url, json={"prompt": "hi"}).status_code == 401
    assert client.post(url, json={"prompt": "hi"}, headers=APPROVER).status_code == 403
    for body in ({}, {"prompt": ""}, {"prompt": "hi", "extra": 1}):
        resp = client.post(url, json=body, headers=REQUESTER)
        assert resp.status_code == 422 and set(resp.json()) == {"error", "detail"}
    resp = client.post("/v1/runs/run_nope/messages", json={"prompt": "hi"}, headers=REQUESTER)
    assert resp.status_code == 404
    assert api_broker.get_run(run_id).status is RunStatus.waiting
