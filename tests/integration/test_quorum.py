"""The two-person rule: N distinct people approve, over any channels, with exactly one outcome.

Races run real threads against a real API server (REST, Slack, webhook replies) on real Redis.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis
from standardwebhooks.webhooks import Webhook

from api.app import create_app
from api.testing import ServerThread
from broker.domain.args_hash import args_hash
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, NewRequest, Request
from broker.domain.persons import voter_of
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import bearer_by_name
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker, single_only  # noqa: F401 - redis, broker, api_broker on both backends
from tests.support.decisions import snapshot
from tests.support.resumes import resumes_of
from tests.support.slack_forms import SIGNING, _ids, slack_click  # noqa: F401

WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"quorum-secret-for-ops-endpoint!!").decode()
TOKENS = {name: f"tok-{name}-0123456789abcdef" for name in ("alice", "bob", "dave", "svc", "eve")}


@pytest.fixture
def cfg() -> Config:
    approvers: dict[str, Any] = {
        "alice": {"roles": ["ops"], "slack_user_id": "U_ALICE"},
        "bob": {"roles": ["ops"], "slack_user_id": "U_BOB"},
        "dave": {"roles": ["ops"]},
        "svc": {"roles": ["requester", "ops"]},  # asks, and could otherwise approve
        "eve": {"roles": ["marketing"]},
    }
    for name, approver in approvers.items():
        approver["token_sha256"] = hash_token(TOKENS[name])
    channels = ["inbox", "slack:approvals", "webhook:ops"]
    return parse_config(
        {
            "queues": {
                "default": {"channels": channels, "quorum": 2, "roles": ["ops"]},
                "solo": {"channels": channels},
            },
            "webhooks": {
                "ops": {"url": "http://127.0.0.1:9/ops", "secret": WEBHOOK_SECRET, "roles": ["ops"]}
            },
            "slack": {
                "bot_token": "xoxb-test",
                "signing_secret": SIGNING,
                "api_base_url": "http://127.0.0.1:9/api",
                "channels": {"approvals": {"channel": "C1"}},
            },
            "approvers": approvers,
        }
    )


auth = bearer_by_name(TOKENS)


def webhook_reply(body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(body).encode()
    msg_id = f"msg_{next(_ids)}"
    when = datetime.now(UTC)
    return raw, {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(WEBHOOK_SECRET).sign(msg_id, when, raw.decode()),
        "content-type": "application/json",
    }


def events_of(broker: Broker, request_id: str, queue: str = "default") -> list[str]:
    return [
        e[1][b"type"].decode()
        for e in broker.redis.xrange(broker.keys.of_request(request_id).stream(queue))
        if e[1][b"request_id"].decode() == request_id
    ]


def new(broker: Broker, **kw: Any) -> Request:
    kw.setdefault("tool_name", "refund")
    kw.setdefault("args", {"amount": 500})
    return broker.create_request(NewRequest(**kw))


# ---- the race: three approvers and one rejecter over three channels at once ----------------


def test_three_approvers_and_a_rejecter_racing_leave_one_outcome_resumed_once(
    api_broker: Broker, cfg: Config, new_redis: Callable[[], Redis]
) -> None:
    app = create_app(Settings(), cfg, Broker(new_redis(), cfg, prefix="t:"))
    outcomes: set[str] = set()
    with ServerThread(app) as server:
        clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(4)]
        try:
            for i in range(25):
                run_id = f"run_race{i:03d}"
                [req] = api_broker.create_round(
                    run_id, 1, [NewRequest(tool_name="refund", args={"amount": 500, "i": i})]
                )
                assert req.quorum == 2
                rest, slack, hook, reject = clients
                calls = [
                    partial(_rest, rest, req.id, "bob", {"outcome": "approved"}),
                    partial(_slack, slack, req.id),
                    partial(_hook, hook, req.id),
                    partial(_rest, reject, req.id, "dave", {"outcome": "rejected", "reason": "no"}),
                ]
                replies = _race(calls)
                stored = api_broker.get_request(req.id)
                assert stored.status.value in ("approved", "rejected")
                outcomes.add(stored.status.value)
                assert resumes_of(api_broker, run_id) == 1  # resumed exactly once
                assert events_of(api_broker, req.id).count("approval.decided") == 1
                votes = stored.approvals_by_args.get(req.args_hash, 0)
                rest_r, slack_r, hook_r, reject_r = replies
                if stored.status.value == "approved":
                    assert votes == 2  # the votes recorded are the ones that decided it
                    assert reject_r.status_code == 409
                    last = voter_of(cfg, stored.decision.decided_by)  # the person who decided
                    assert last in {v.by for v in stored.approvals}
                    approvers_ok = [
                        rest_r.status_code == 200,
                        slack_r.json().get("ok") is True,
                        hook_r.status_code == 200,
                    ]
                    assert approvers_ok.count(True) == 2
                else:
                    assert votes <= 1
                    assert reject_r.status_code == 200
                    assert stored.decision.decided_by == "dave"
                voted = events_of(api_broker, req.id).count("approval.voted")
                assert voted == (1 if votes else 0)
        finally:
            for c in clients:
                c.close()
    print("outcomes seen:", outcomes)
    assert outcomes  # each iteration had exactly one


def _rest(client: httpx.Client, request_id: str, who: str, body: dict) -> httpx.Response:
    return client.post(f"/v1/requests/{request_id}/decision", json=body, headers=auth(who))


def _slack(client: httpx.Client, request_id: str) -> httpx.Response:
    body, headers = slack_click("U_ALICE", request_id)
    return client.post("/v1/slack/interactions", content=body, headers=headers)


def _hook(client: httpx.Client, request_id: str) -> httpx.Response:
    raw, headers = webhook_reply(
        {"request_id": request_id, "outcome": "approved", "decided_by": "jane"}
    )
    return client.post("/v1/webhooks/ops/replies", content=raw, headers=headers)


def _race(calls: list[Any]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def go(i: int) -> None:
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in results)
    return results


# ---- two people over two channels; one person over two channels ---------------------------


def test_two_people_over_two_channels_approve_a_quorum_of_two(
    client: TestClient, api_broker: Broker
) -> None:
    req = new(api_broker)
    first = client.post("/v1/slack/interactions", content=(c := slack_click("U_ALICE", req.id))[0], headers=c[1])  # fmt: skip
    assert first.json()["status"] == "pending"
    voted = api_broker.get_request(req.id)
    assert [(v.by, v.channel, v.args_hash) for v in voted.approvals] == [
        ("alice", "slack:approvals", req.args_hash)
    ]
    assert events_of(api_broker, req.id) == ["approval.requested", "approval.voted"]
    second = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=auth("bob")
    )
    assert second.status_code == 200 and second.json()["status"] == "approved"
    body = second.json()
    assert [v["by"] for v in body["approvals"]] == ["alice", "bob"]
    assert body["approvals_by_args"] == {req.args_hash: 2}
    assert body["decision"]["decided_by"] == "bob"
    assert events_of(api_broker, req.id)[-1] == "approval.decided"


def test_one_person_over_two_channels_is_one_vote(client: TestClient, api_broker: Broker) -> None:
    """A Slack user and the token of the approver they map to are one person."""
    req = new(api_broker)
    client.post("/v1/slack/interactions", content=(c := slack_click("U_ALICE", req.id))[0], headers=c[1])  # fmt: skip
    again = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=auth("alice")
    )
    assert again.status_code == 200  # a harmless repeat
    stored = api_broker.get_request(req.id)
    assert stored.is_pending and [v.by for v in stored.approvals] == ["alice"]
    assert events_of(api_broker, req.id).count("approval.voted") == 1


def test_webhook_people_who_are_no_approvers_are_the_endpoints_one_vote(
    client: TestClient, api_broker: Broker
) -> None:
    """The endpoint vouches for configured approvers only: jane and joe (no approvers) are
    `webhook:ops` each time, one vote, so the endpoint alone never meets a quorum of 2."""
    req = new(api_broker)
    for person in ("jane", "jane", "joe"):
        raw, headers = webhook_reply({"request_id": req.id, "outcome": "approved", "decided_by": person})  # fmt: skip
        assert (
            client.post("/v1/webhooks/ops/replies", content=raw, headers=headers).status_code == 200
        )
    stored = api_broker.get_request(req.id)
    assert stored.is_pending
    assert [v.by for v in stored.approvals] == ["webhook:ops"]
    assert stored.decision is None


def test_an_earlier_voter_repeating_after_the_decision_gets_200(
    client: TestClient, api_broker: Broker
) -> None:
    req = new(api_broker)
    for who in ("alice", "bob", "alice"):
        resp = client.post(
            f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=auth(who)
        )
        assert resp.status_code == 200, resp.text
    late = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=auth("dave")
    )
    assert late.status_code == 409 and late.json()["request"]["status"] == "approved"


# ---- what counts: args, rejections, the creator -------------------------------------------


def test_approvals_of_different_args_do_not_add_up(api_broker: Broker) -> None:
    req = new(api_broker)
    smaller = {"amount": 200}
    api_broker.decide(req.id, Decision(outcome="approved"), decided_by="alice")
    mod = api_broker.decide(req.id, Decision(outcome="modified", args=smaller), decided_by="bob")
    assert mod.is_pending
    assert mod.approvals_by_args == {req.args_hash: 1, args_hash(smaller): 1}
    done = api_broker.decide(req.id, Decision(outcome="modified", args=smaller), decided_by="dave")
    assert done.status.value == "modified" and done.decision.args == smaller
    assert done.approvals_by_args == {req.args_hash: 1, args_hash(smaller): 2}


def test_a_person_changing_their_mind_moves_their_vote(api_broker: Broker) -> None:
    req = new(api_broker)
    smaller = {"amount": 100}
    api_broker.decide(req.id, Decision(outcome="approved"), decided_by="alice")
    moved = api_broker.decide(
        req.id, Decision(outcome="modified", args=smaller), decided_by="alice"
    )
    assert moved.is_pending and moved.approvals_by_args == {args_hash(smaller): 1}


def test_one_rejection_rejects_after_partial_approvals(api_broker: Broker) -> None:
    req = new(api_broker, quorum=3)
    api_broker.decide(req.id, Decision(outcome="approved"), decided_by="alice")
    api_broker.decide(req.id, Decision(outcome="approved"), decided_by="bob")
    no = api_broker.decide(req.id, Decision(outcome="rejected", reason="no"), decided_by="dave")
    assert no.status.value == "rejected" and len(no.approvals) == 2


def test_the_creator_may_not_approve_and_nothing_is_written(
    client: TestClient, api_broker: Broker
) -> None:
    created = client.post(
        "/v1/requests",
        json={"tool_name": "refund", "args": {"amount": 900}, "queue": "solo"},
        headers=auth("svc"),
    )
    assert created.status_code == 201 and created.json()["created_by"] == "svc"
    rid = created.json()["id"]
    before = snapshot(api_broker.redis)
    resp = client.post(
        f"/v1/requests/{rid}/decision", json={"outcome": "approved"}, headers=auth("svc")
    )
    assert resp.status_code == 403 and resp.json()["error"] == "creator_may_not_approve"
    assert snapshot(api_broker.redis) == before
    # the atomic step refuses too, whoever calls it
    with pytest.raises(Exception) as caught:
        api_broker.decide(rid, Decision(outcome="approved"), decided_by="svc")
    assert getattr(caught.value, "code", None) == "creator_may_not_approve"
    assert snapshot(api_broker.redis) == before
    # a body can't claim to be someone else's request
    spoofed = client.post(
        "/v1/requests",
        json={"tool_name": "x", "queue": "solo", "created_by": "alice"},
        headers=auth("svc"),
    )
    assert spoofed.json()["created_by"] == "svc"


# ---- bad input: clear errors, nothing written ---------------------------------------------


@pytest.mark.parametrize(
    ("quorum", "code"), [(0, "invalid"), (11, "invalid"), (1, "quorum_below_queue")]
)
def test_a_bad_quorum_is_refused_and_nothing_is_written(
    client: TestClient, api_broker: Broker, quorum: int, code: str
) -> None:
    before = snapshot(api_broker.redis)
    resp = client.post(
        "/v1/requests",
        json={"tool_name": "refund", "args": {}, "quorum": quorum},
        headers=auth("svc"),
    )
    assert resp.status_code == 422 and resp.json()["error"] == code, resp.text
    assert resp.json()["detail"]
    assert snapshot(api_broker.redis) == before


def test_a_request_may_ask_for_more_than_its_queue(client: TestClient) -> None:
    resp = client.post(
        "/v1/requests", json={"tool_name": "refund", "quorum": 3}, headers=auth("svc")
    )
    assert resp.status_code == 201 and resp.json()["quorum"] == 3
    plain = client.post("/v1/requests", json={"tool_name": "refund"}, headers=auth("svc"))
    assert plain.json()["quorum"] == 2  # the queue's


@pytest.mark.parametrize("bad", [0, 11, "2", True])
def test_a_bad_quorum_in_metadata_is_refused(api_broker: Broker, bad: Any) -> None:
    with pytest.raises(Exception) as caught:
        new(api_broker, metadata={"quorum": bad})
    assert getattr(caught.value, "code", None) == "invalid_quorum"
    assert api_broker.list_requests() == []


def test_a_vote_without_the_role_is_404_and_writes_nothing(
    client: TestClient, api_broker: Broker
) -> None:
    req = new(api_broker)
    before = snapshot(api_broker.redis)
    resp = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=auth("eve")
    )
    assert resp.status_code == 404 and resp.json()["error"] == "not_found"  # out of sight
    assert snapshot(api_broker.redis) == before


def test_a_partial_approval_is_streamed_as_approval_voted(api_broker: Broker, cfg: Config) -> None:
    app = create_app(Settings(), cfg, api_broker)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        with http.stream("GET", "/v1/events", headers=auth("alice")) as resp:
            lines = resp.iter_lines()
            assert next(lines) == ": connected"
            req = new(api_broker)
            api_broker.decide(req.id, Decision(outcome="approved"), decided_by="alice")
            seen: list[tuple[str, Any]] = []
            event = None
            for line in lines:
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event:
                    seen.append((event, json.loads(line.removeprefix("data: "))))
                    if len(seen) == 2:
                        break
    assert [e for e, _ in seen] == ["approval.requested", "approval.voted"]
    assert [v["by"] for v in seen[1][1]["approvals"]] == ["alice"]
