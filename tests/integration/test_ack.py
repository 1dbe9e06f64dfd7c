""" "I'm on it": an ack keeps a request pending and holds its escalation, then escalation resumes."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.domain.errors import Conflict
from broker.domain.models import Decision, NewRequest, Request
from broker.domain.principals import Principal, hash_token
from broker.facade import Broker
from broker.judge import Judge
from channels.slack import action_ids as ids
from tests.support.auth import bearer_by_name, person
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker  # noqa: F401 - redis, broker, api_broker on both backends
from tests.support.decisions import snapshot
from tests.support.slack_forms import SIGNING, slack_click
from tests.support.waiting import wait_for

TOKENS = {"alice": "tok-alice-0123456789abcdef", "eve": "tok-eve-0123456789abcdef0"}


API_CONFIG = {
    "queues": {
        "default": {
            "channels": ["inbox", "slack:approvals"],
            "timeout_s": 60,
            "escalate_to": "managers",
            "ack_timeout_s": 300,
            "roles": ["ops"],
        },
        "managers": {"channels": ["inbox"], "timeout_s": 600, "quorum": 2},
        "fast": {
            "channels": ["inbox"],
            "timeout_s": 0.3,
            "escalate_to": "managers",
            "ack_timeout_s": 3,
        },
    },  # fmt: skip
    "slack": {
        "bot_token": "xoxb-test",
        "signing_secret": SIGNING,
        "api_base_url": "http://127.0.0.1:9/api",
        "channels": {"approvals": {"channel": "C1"}},
    },
    "approvers": {
        "alice": {
            "roles": ["ops"],
            "slack_user_id": "U_ALICE",
            "token_sha256": hash_token(TOKENS["alice"]),
        },
        "eve": person(TOKENS["eve"], ["marketing"]),
    },
}


auth = bearer_by_name(TOKENS)


def new(broker: Broker, **kw: Any) -> Request:
    return broker.create_request(NewRequest(tool_name="restart", args={"svc": "db"}, **kw))


def expires(broker: Broker, request_id: str) -> float:
    score = broker.redis.zscore(broker.keys.of_request(request_id).expiry, request_id)
    assert score is not None
    return float(score)


def test_an_ack_holds_escalation_past_the_timeout_then_it_resumes(
    client: TestClient, api_broker: Broker
) -> None:
    req = new(api_broker)
    due = req.expires_at.timestamp()
    before = redis_now(api_broker)
    resp = client.post(f"/v1/requests/{req.id}/ack", headers=auth("alice"))
    after = redis_now(api_broker)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "pending" and body["decision"] is None and body["acked_by"] == "alice"
    [entry] = [h for h in body["history"] if h["event"] == "acked"]
    assert entry["by"] == "alice" and entry["channel"] == "inbox" and entry["at"]
    held = expires(api_broker, req.id)
    assert before + 300 <= held <= after + 300  # the ack's time + the queue's ack_timeout_s
    assert api_broker.sweep(now=due + 1) == []  # past its timeout: still held
    assert api_broker.sweep(now=held - 1) == []
    assert api_broker.get_request(req.id).queue == "default"
    [moved] = api_broker.sweep(now=held + 1)  # the ack ran out: escalation resumes
    assert (moved.action, moved.to_queue) == ("escalated", "managers")


def redis_now(broker: Broker) -> float:
    """Redis's clock (TIME), which the steps read when no `now` is given."""
    seconds, micros = broker.redis.time()
    return seconds + micros / 1e6


def test_an_ack_holds_a_fast_escalating_request_on_the_real_clock(api_broker: Broker) -> None:
    """Short timeouts, no simulated time: the sweeps read Redis's clock, and so does the test.

    Each sweep that ends before the hold does (on Redis's clock, read after it) ran wholly
    inside the hold, past the request's timeout, so it must leave the request where it is;
    the first sweep after the hold moves it. A busy machine only changes how many sweeps fall
    inside the hold (at least one must: the hold is 3 s).
    """
    judge = Judge(api_broker)
    alice = Principal("alice", frozenset({"ops"}))
    req = new(api_broker, queue="fast")
    judge.ack(req.id, alice, via=("inbox",))
    until = expires(api_broker, req.id)  # now + the queue's ack_timeout_s (3)
    wait_for(lambda: redis_now(api_broker) > req.expires_at.timestamp(), timeout=5)
    inside: list[float] = []

    def swept_after_the_hold() -> bool:
        moved = api_broker.sweep()
        ended = redis_now(api_broker)
        if ended < until:
            assert moved == [], f"escalated {until - ended:.3f} s before its ack ran out"
            inside.append(ended)
            return False
        return bool(moved)

    wait_for(swept_after_the_hold, timeout=30)
    assert inside, "no sweep ran inside the hold"
    assert api_broker.get_request(req.id).queue == "managers"


def test_the_sweep_honours_an_ack_even_if_the_expiry_entry_is_earlier(
    api_broker: Broker,
) -> None:
    req = new(api_broker)
    Judge(api_broker).ack(req.id, Principal("alice", frozenset({"ops"})), via=("inbox",))
    held = expires(api_broker, req.id)
    api_broker.redis.zadd(
        api_broker.keys.of_request(req.id).expiry, {req.id: req.expires_at.timestamp()}
    )
    assert api_broker.sweep(now=req.expires_at.timestamp() + 1) == []
    assert expires(api_broker, req.id) == pytest.approx(held, abs=1e-3)


def test_an_ack_is_bound_to_the_queue_it_was_given_in(api_broker: Broker) -> None:
    req = new(api_broker)
    Judge(api_broker).ack(req.id, Principal("alice", frozenset({"ops"})), via=("inbox",))
    api_broker.escalate(req.id, decided_by="bob")  # moved by hand: the new queue's clock applies
    moved = api_broker.get_request(req.id)
    [timed_out] = api_broker.sweep(now=moved.expires_at.timestamp() + 1)
    assert timed_out.action == "timed_out"


def test_an_ack_never_counts_as_a_vote_nor_decides(api_broker: Broker) -> None:
    req = new(api_broker, queue="managers")  # quorum 2
    alice = Principal("alice", frozenset({"ops"}))
    judge = Judge(api_broker)
    judge.ack(req.id, alice, via=("inbox",))
    after = judge.decide(req.id, Decision(outcome="approved"), alice, via=("inbox",))
    assert after.request.is_pending and [v.by for v in after.request.approvals] == ["alice"]


def test_slack_im_on_it_acks(client: TestClient, api_broker: Broker) -> None:
    req = new(api_broker)
    body, headers = slack_click("U_ALICE", req.id, ids.ACK)
    resp = client.post("/v1/slack/interactions", content=body, headers=headers)
    assert resp.status_code == 200 and resp.json()["ok"] is True
    assert "paused until" in resp.json()["text"]
    stored = api_broker.get_request(req.id)
    assert stored.is_pending and stored.acked_by == "alice"
    assert [h.channel for h in stored.history if h.event == "acked"] == ["slack:approvals"]
    replay = client.post("/v1/slack/interactions", content=body, headers=headers)
    assert replay.status_code == 409 and replay.json()["error"] == "replayed"


# ---- bad input: clear errors, nothing written ---------------------------------------------


def test_an_ack_on_a_decided_request_is_409_with_the_request(
    client: TestClient, api_broker: Broker
) -> None:
    req = new(api_broker)
    api_broker.decide(req.id, Decision(outcome="rejected", reason="no"), decided_by="bob")
    before = snapshot(api_broker.redis)
    resp = client.post(f"/v1/requests/{req.id}/ack", headers=auth("alice"))
    assert resp.status_code == 409 and resp.json()["error"] == "conflict"
    assert resp.json()["request"]["status"] == "rejected"
    assert snapshot(api_broker.redis) == before


def test_an_ack_on_a_timed_out_request_is_refused(api_broker: Broker) -> None:
    req = new(api_broker, queue="managers")
    api_broker.sweep(now=req.expires_at.timestamp() + 1)
    with pytest.raises(Conflict) as caught:
        Judge(api_broker).ack(req.id, Principal("alice", frozenset({"ops"})), via=("inbox",))
    assert caught.value.request.status.value == "timed_out"


def test_an_ack_without_the_role_is_404_and_writes_nothing(
    client: TestClient, api_broker: Broker
) -> None:
    req = new(api_broker)
    before = snapshot(api_broker.redis)
    resp = client.post(f"/v1/requests/{req.id}/ack", headers=auth("eve"))  # eve can't see it
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"
    assert snapshot(api_broker.redis) == before
    assert client.post("/v1/requests/nope/ack", headers=auth("alice")).status_code == 404
    assert client.post(f"/v1/requests/{req.id}/ack").status_code == 401
