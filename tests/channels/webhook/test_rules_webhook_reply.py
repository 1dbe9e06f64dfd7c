"""A signed webhook reply may remember too: `remember` in the reply keeps the rule with the
decision, as the endpoint (`webhook:NAME/person`), limited like any other decider."""

from __future__ import annotations

from fastapi.testclient import TestClient

from broker.domain.models import NewRequest, Status
from broker.facade import Broker
from tests.support.webhooks import post, signed, webhook_cfg  # noqa: F401


def test_a_webhook_reply_with_remember_keeps_a_run_rule(
    client: TestClient, api_broker: Broker
) -> None:
    run_id = api_broker.create_run("ops-agent", "p").id
    calls = [NewRequest(tool_name="restart", args={"svc": s}) for s in ("db", "web")]
    a, b = api_broker.create_round(run_id, 1, calls)
    wide = {"request_id": a.id, "outcome": "approved", "remember": {"tool": "restart"}}
    refused = post(client, "ops", *signed(wide, msg_id="msg_w"))
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    assert api_broker.requests.rules.list() == []
    body = {"request_id": a.id, "outcome": "approved", "remember": 0, "decided_by": "kim"}
    done = post(client, "ops", *signed(body, msg_id="msg_r"))
    assert done.status_code == 200, done.text
    [rule] = api_broker.requests.rules.list()
    assert rule.run_id == run_id and rule.created_by == "webhook:ops/kim"
    assert rule.creator_roles == ["ops"]
    assert [r.status for r in api_broker.get_requests([a.id, b.id])] == [Status.approved] * 2
    again = post(client, "ops", *signed(body, msg_id="msg_r"))  # the webhook-id was spent
    assert again.status_code == 409
