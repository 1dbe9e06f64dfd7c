"""Escalation hardening: only along the chain (admin excepted), deadlines kept across moves,
and links bound to the escalation count so an old link never comes back to life."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import Config
from broker.domain.errors import Conflict, Forbidden
from broker.domain.models import Decision, NewRequest, Outcome, Request
from broker.domain.principals import EVERY_ROLE, Principal, hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.judge import Judge
from channels.email.links import new_nonce, read_link, sign_link
from tests.support.decisions import race

ADMIN = "admin-token-for-the-harden-tests-0123456789"
ALICE = Principal("alice", frozenset({"finance"}))
ROOT = Principal("root", frozenset({EVERY_ROLE}))


API_CONFIG = {
    "queues": {
        "default": {
            "channels": ["email:leads", "inbox"],
            "escalate_to": "managers",
            "timeout_s": 100,
        },
        "managers": {
            "channels": ["email:bosses", "inbox"],
            "escalate_to": "directors",
            "timeout_s": 1000,
        },
        "directors": {"channels": ["inbox"], "timeout_s": 5000},
        "audit": {"channels": [], "timeout_s": 50},  # nobody watches it
    },
    "email": {
        "public_url": "http://testserver",
        "lists": {
            "leads": {"to": ["alice@example.com"]},
            "bosses": {"to": ["boss@example.com"]},
        },
    },
    "approvers": {
        "alice": {
            "roles": ["finance"],
            "email": "alice@example.com",
            "token_sha256": hash_token("tok-alice"),
        },
        "boss": {"roles": ["finance"], "email": "boss@example.com"},
    },
}


@pytest.fixture
def client(api_broker: Broker, cfg: Config) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(admin_token=ADMIN), cfg, api_broker)) as c:
        yield c


def make(broker: Broker) -> Request:
    return broker.create_request(NewRequest(tool_name="refund", args={"order_id": "A1"}))


def mailed_link(broker: Broker, req: Request, action: str, to: str) -> str:
    """A link as the notifier mails it: bound to the queue and the escalation count now."""
    token = sign_link(
        broker, req.id, to, action, new_nonce(), queue=req.queue, escalations=req.escalations
    )
    return "/v1/email/" + token


def escalate(client: TestClient, req: Request, token: str, target: str) -> tuple[int, dict]:
    resp = client.post(
        f"/v1/requests/{req.id}/decision",
        json={"outcome": "escalated", "target": target},
        headers={"Authorization": f"Bearer {token}"},
    )
    return resp.status_code, resp.json()


def test_an_escalation_outside_the_chain_is_refused_and_the_admin_may_go_anywhere(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    status, body = escalate(client, req, "tok-alice", "audit")
    assert status == 403 and body["error"] == "forbidden"
    assert "escalate_to chain (default -> managers -> directors)" in body["detail"]
    assert api_broker.get_request(req.id).queue == "default"
    assert api_broker.get_request(req.id).escalations == 0
    # further along the chain is fine: two steps at once
    status, body = escalate(client, req, "tok-alice", "directors")
    assert status == 200 and body["queue"] == "directors" and body["escalations"] == 1
    # back down the chain is not, for an approver
    status, body = escalate(client, req, "tok-alice", "default")
    assert status == 403
    status, body = escalate(client, req, ADMIN, "audit")
    assert status == 200 and body["queue"] == "audit" and body["escalations"] == 2


def test_an_old_link_is_dead_after_a_round_trip_back_to_its_queue(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    first = mailed_link(api_broker, req, "approve", "alice@example.com")
    assert read_link(api_broker, first.rsplit("/", 1)[1], 3600).escalations == 0
    status, _ = escalate(client, req, "tok-alice", "managers")
    assert status == 200
    status, body = escalate(client, req, ADMIN, "default")  # back, by the admin
    assert status == 200 and body["queue"] == "default" and body["escalations"] == 2
    for resp in (client.get(first), client.post(first, data={"args_hash": req.args_hash})):
        assert resp.status_code == 409, resp.text
        assert 'data-error="escalated"' in resp.text
    back = api_broker.get_request(req.id)
    assert back.is_pending and back.decision is None
    fresh = mailed_link(api_broker, back, "approve", "alice@example.com")
    assert client.post(fresh).status_code == 200
    assert api_broker.get_request(req.id).status.value == "approved"


def test_the_atomic_step_refuses_a_decision_or_escalation_minted_before_a_move(
    api_broker: Broker,
) -> None:
    req = make(api_broker)
    api_broker.escalate(req.id, "managers", decided_by="alice")
    api_broker.escalate(req.id, "default", decided_by="root")
    approve = Decision(outcome=Outcome.approved)
    with pytest.raises(Conflict) as exc:
        api_broker.decide(req.id, approve, decided_by="alice", in_queue="default", in_escalation=0)
    assert exc.value.code == "escalated"
    with pytest.raises(Conflict) as exc:  # a stale escalation from the queue it has left
        api_broker.escalate(req.id, "directors", decided_by="boss", in_queue="managers")
    assert exc.value.code == "escalated"
    with pytest.raises(Conflict) as exc:
        api_broker.escalate(
            req.id, "managers", decided_by="alice", in_queue="default", in_escalation=0
        )
    assert exc.value.code == "escalated"
    now = api_broker.get_request(req.id)
    assert (now.queue, now.escalations, now.is_pending) == ("default", 2, True)
    assert len([h for h in now.history if h.event == "escalated"]) == 2
    done = api_broker.decide(
        req.id, approve, decided_by="alice", in_queue="default", in_escalation=2
    )
    assert done.status.value == "approved"


def test_the_decision_service_passes_the_count_it_read(api_broker: Broker, cfg: Config) -> None:
    """A decision made on a read from before a move is refused, though the queue matches."""
    judge = Judge(api_broker, cfg)
    req = make(api_broker)
    stale = api_broker.get_request(req.id)
    api_broker.escalate(req.id, "managers", decided_by="alice")
    api_broker.escalate(req.id, "default", decided_by="root")
    with pytest.raises(Conflict) as exc:
        judge.decide(
            req.id, Decision(outcome=Outcome.approved), ALICE, via=["inbox"], current=stale
        )
    assert exc.value.code == "escalated"
    assert api_broker.get_request(req.id).is_pending
    with pytest.raises(Forbidden):
        judge.decide(
            req.id, Decision(outcome=Outcome.escalated, target="audit"), ALICE, via=["inbox"]
        )
    moved = judge.decide(req.id, Decision(outcome=Outcome.escalated, target="audit"), ROOT, via=[])
    assert moved.request.queue == "audit"


def test_the_deadline_is_kept_across_manual_moves(api_broker: Broker) -> None:
    req = make(api_broker)
    first_deadline = req.expires_at
    assert (first_deadline - req.created_at).total_seconds() == pytest.approx(100, abs=0.01)
    up = api_broker.escalate(req.id, "managers", decided_by="alice")
    managers_deadline = up.expires_at
    arrived = next(h.at for h in up.history if h.event == "escalated")
    assert (managers_deadline - arrived).total_seconds() == pytest.approx(1000, abs=0.01)
    down = api_broker.escalate(req.id, "default", decided_by="root")
    assert down.expires_at == first_deadline  # not restarted: from its first arrival there
    again = api_broker.escalate(req.id, "managers", decided_by="alice")
    assert again.expires_at == managers_deadline
    score = api_broker.redis.zscore(api_broker.keys.expiry, req.id)
    assert score == pytest.approx(managers_deadline.timestamp(), abs=1e-3)


def test_the_sweeper_keeps_first_deadlines_too(api_broker: Broker) -> None:
    req = make(api_broker)
    up = api_broker.escalate(req.id, "managers", decided_by="alice")
    managers_deadline = up.expires_at
    api_broker.escalate(req.id, "default", decided_by="root")
    # default's deadline passes: the sweeper moves it on to managers, whose first deadline holds
    due = req.expires_at.timestamp() + 1
    [result] = api_broker.sweep(now=due)
    assert (result.action, result.to_queue) == ("escalated", "managers")
    swept = api_broker.get_request(req.id)
    assert swept.expires_at == managers_deadline and swept.escalations == 3
    # a queue reached for the first time gives its timeout from the sweep
    [result] = api_broker.sweep(now=managers_deadline.timestamp() + 1)
    assert result.to_queue == "directors"
    top = api_broker.get_request(req.id)
    assert top.expires_at.timestamp() == pytest.approx(
        managers_deadline.timestamp() + 5001, abs=0.01
    )


def test_racing_escalations_from_one_read_move_the_request_once(
    api_broker: Broker, cfg: Config, redis_url: str
) -> None:
    """Twenty people escalate what they all saw in `default`, at once, through the decision
    service (one read, then the atomic step), half to managers and half to directors: one
    move; the others are refused, none moves it on from where the winner put it."""
    req = make(api_broker)
    seen = api_broker.get_request(req.id)

    def go(i: int) -> object:
        own = Broker(Redis.from_url(redis_url), cfg, prefix="t:")
        person = Principal(f"p{i}", frozenset({"finance"}))
        decision = Decision(outcome=Outcome.escalated, target=("managers", "directors")[i % 2])
        return Judge(own, cfg).decide(req.id, decision, person, via=["inbox"], current=seen)

    results = race(20, go)
    moved = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, Conflict)]
    assert len(moved) == 1 and moved[0].recorded, results
    assert len(refused) == 19 and {c.code for c in refused} == {"escalated"}
    final = api_broker.get_request(req.id)
    assert final.queue == moved[0].request.queue and final.escalations == 1
    assert len([h for h in final.history if h.event == "escalated"]) == 1
