"""Email links under the two-person rule: each recipient's link stays valid until the request is
decided, and one person's used link is not a second vote."""

from __future__ import annotations

from fastapi.testclient import TestClient

from broker.domain.models import NewRequest
from broker.facade import Broker
from tests.support.email_links import link, page_error

API_CONFIG = {
    "queues": {"default": {"channels": ["email:leads"], "quorum": 2}},
    "email": {
        "public_url": "http://testserver",
        "link_ttl_s": 3600,
        "lists": {"leads": {"to": ["alice@example.com", "bob@example.com", "cfo@example.com"]}},
    },
    "approvers": {
        "alice": {"roles": ["finance"], "email": "alice@example.com"},
        "bob": {"roles": ["finance"], "email": "bob@example.com"},
        "cfo": {"roles": ["finance"], "email": "cfo@example.com"},
    },
}


def test_links_of_the_others_stay_valid_until_the_request_is_decided(
    client: TestClient, api_broker: Broker
) -> None:
    req = api_broker.create_request(NewRequest(tool_name="refund", args={"amount": 900}))
    alice, bob, cfo = (link(api_broker, req, "approve", f"{n}@example.com") for n in ("alice", "bob", "cfo"))  # fmt: skip
    assert client.post(alice).status_code == 200
    voted = api_broker.get_request(req.id)
    assert voted.is_pending and [(v.by, v.channel) for v in voted.approvals] == [
        ("alice", "email:leads")
    ]
    page_error(client.post(alice), 410, "link_used")  # her link is spent: no second vote
    assert client.get(bob).status_code == 200  # the others' links still work
    assert client.post(bob).status_code == 200
    assert api_broker.get_request(req.id).status.value == "approved"
    page_error(client.post(cfo), 409, "conflict")  # decided now
