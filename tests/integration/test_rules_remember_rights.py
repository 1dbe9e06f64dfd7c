"""`remember` keeps the rules a decision keeps: the creator never approves (nor remembers an
allow), a request of quorum > 1 is remembered only by role `policy` with `quorum_bypass`, and
a request escalated meanwhile (even away and back) is not decided by the step."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.judge import Judge
from tests.support.remember import ALICE, PAT, RAW, round_of

API_CONFIG = {
    **RAW,
    "queues": {
        "default": {"channels": ["inbox"], "escalate_to": "other"},
        "other": {"channels": ["inbox"]},
        "pair": {"channels": ["inbox"], "quorum": 2},
    },
}


def remember(client: TestClient, rid: str, who: dict[str, str], rule: Any = 0) -> Any:
    body = {"outcome": "approved", "remember": rule}
    return client.post(f"/v1/requests/{rid}/decision", json=body, headers=who)


def test_the_creator_may_not_remember_an_approval(client: TestClient, api_broker: Broker) -> None:
    run_id = api_broker.create_run("refunds", "p").id
    [req] = api_broker.create_round(
        run_id, 1, [NewRequest(tool_name="refund", args={"amount": 5}, created_by="alice")]
    )
    res = remember(client, req.id, ALICE)
    assert res.status_code == 403, res.text
    assert res.json()["error"] == "creator_may_not_approve"
    assert api_broker.get_request(req.id).is_pending
    assert client.get("/v1/rules", headers=PAT).json() == []


def test_quorum_needs_policy_and_quorum_bypass(client: TestClient, api_broker: Broker) -> None:
    req = api_broker.create_request(NewRequest(tool_name="wire", queue="pair", args={"amount": 5}))
    plain = {"tool": "wire", "agent": "refunds"}
    res = remember(client, req.id, PAT, plain)
    assert res.status_code == 422, res.text
    assert api_broker.get_request(req.id).is_pending
    res = remember(client, req.id, PAT, {**plain, "quorum_bypass": True})
    assert res.status_code == 200, res.text
    assert res.json()["status"] == "approved"


def test_an_escalation_meanwhile_stops_the_step(
    client: TestClient, api_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, (a, _) = round_of(api_broker)
    real = Judge.covered_siblings

    def away_and_back(self: Judge, request: Any, rule: Any) -> Any:
        api_broker.escalate(a.id, "other", decided_by="root")
        api_broker.escalate(a.id, "default", decided_by="root")
        return real(self, request, rule)

    monkeypatch.setattr(Judge, "covered_siblings", away_and_back)
    res = remember(client, a.id, ALICE)
    assert res.status_code == 409, res.text
    assert api_broker.get_request(a.id).is_pending
