"""Least privilege: an auditor (or requester+auditor) never decides or acks, and only a run's
starter posts a new prompt to it (others 404, an auditor 403)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from broker.domain.models import NewRequest
from broker.domain.principals import Principal
from broker.facade import Broker
from broker.judge import INBOX, Judge
from broker.runs.starting import start_run
from tests.support.auth import bearer, person

ROLES = {"app": ["requester"], "bob": ["requester"], "audit": ["auditor"],
         "audreq": ["auditor", "requester"], "alice": ["finance"]}  # fmt: skip


def h(name: str) -> dict[str, str]:
    return bearer(f"tok-{name}")


API_CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "approvers": {n: person(f"tok-{n}", r) for n, r in ROLES.items()},
    "agents": {"chat": {"path": "tests.support.chat_agent:chat_agent"}},
}


@pytest.mark.parametrize("who", ["audit", "audreq"])
def test_an_auditor_neither_decides_nor_acks(
    client: TestClient, api_broker: Broker, who: str
) -> None:
    [req] = api_broker.create_requests([NewRequest(tool_name="wire")])
    assert client.get(f"/v1/requests/{req.id}", headers=h(who)).status_code == 200
    decided = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=h(who)
    )
    assert decided.status_code == 403, decided.text
    acked = client.post(f"/v1/requests/{req.id}/ack", headers=h(who))
    assert acked.status_code == 403, acked.text
    assert api_broker.get_request(req.id).is_pending
    # the mail path asks the same question: an auditor's mail carries no links
    refusal = Judge(api_broker).refusal(Principal(who, frozenset(ROLES[who])), req, (INBOX,))
    assert refusal is not None and "auditor" in refusal
    assert (
        client.post(
            f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=h("alice")
        ).status_code
        == 200
    )


def test_only_the_starter_posts_a_new_prompt_to_a_run(
    client: TestClient, api_broker: Broker
) -> None:
    run = start_run(api_broker, "chat", "hello", started_by="app")
    url = f"/v1/runs/{run.id}/messages"
    other = client.post(url, json={"prompt": "mine now"}, headers=h("bob"))
    assert other.status_code == 404, other.text
    audit = client.post(url, json={"prompt": "mine now"}, headers=h("audreq"))
    assert audit.status_code == 403, audit.text
    # the starter gets through to the run's own answer (queued, not waiting: 409)
    own = client.post(url, json={"prompt": "go on"}, headers=h("app"))
    assert own.status_code == 409, own.text
