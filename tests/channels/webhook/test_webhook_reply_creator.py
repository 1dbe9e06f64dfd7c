"""A webhook reply names its person (`decided_by`): the one who asked for a call never approves
it that way either (403 creator_may_not_approve); a rejection by them still counts."""

from __future__ import annotations

from fastapi.testclient import TestClient

from broker.facade import Broker
from tests.support.webhooks import make, post, signed, webhook_cfg  # noqa: F401 - the config fixture


def test_the_creator_may_not_approve_through_a_webhook(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, created_by="dana")
    body = {"request_id": req.id, "outcome": "approved", "decided_by": "dana"}
    resp = post(client, "ops", *signed(body, msg_id="m1"))
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"] == "creator_may_not_approve"
    assert api_broker.get_request(req.id).is_pending
    other = {"request_id": req.id, "outcome": "approved", "decided_by": "erin"}
    resp = post(client, "ops", *signed(other, msg_id="m2"))
    assert resp.status_code == 200, resp.text
    assert api_broker.get_request(req.id).decision.decided_by == "webhook:ops/erin"
