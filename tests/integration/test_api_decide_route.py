"""The decision routes (`POST /v1/requests/{id}/decision`, `POST /v1/webhooks/{name}/replies`)
answer what the one judge (`broker.judge.deciding`) decides, case by case: status, error code, the
request as recorded; a refused decision writes nothing; concurrent decisions have one winner
over a real server; a flushed script cache and an unreachable Redis are handled.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis
from standardwebhooks.webhooks import Webhook

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest, Request
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import bearer_by_name

TOKENS = {
    "alice": "tok-alice-hotapi",  # finance
    "bob": "tok-bob-hotapi",  # ops
    "carol": "tok-carol-hotapi",  # finance, ops
    "agent": "tok-agent-hotapi",  # requester only
    "admin": "tok-admin-hotapi",  # the admin token
}
SECRET = "whsec_" + base64.b64encode(b"hotapi-webhook-secret-0123456789").decode()
SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer", "maximum": 100}}}


@pytest.fixture
def cfg() -> Config:
    def approver(name: str, *roles: str) -> dict[str, Any]:
        return {"token_sha256": hash_token(TOKENS[name]), "roles": list(roles)}

    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox", "webhook:ops"], "escalate_to": "senior"},
                "senior": {"channels": ["inbox"], "roles": ["ops"]},
                "pair": {"channels": ["inbox", "webhook:ops"], "quorum": 2},
                "slack_only": {"channels": ["webhook:ops"]},
            },
            "webhooks": {
                "ops": {"url": "http://127.0.0.1:9/ops", "secret": SECRET, "roles": ["ops"]}
            },
            "approvers": {
                "alice": approver("alice", "finance"),
                "bob": approver("bob", "ops"),
                "carol": approver("carol", "finance", "ops"),
                "agent": approver("agent", "requester"),
            },
        }
    )


@pytest.fixture
def settings() -> Settings:
    return Settings(admin_token=TOKENS["admin"])


@pytest.fixture
def client(api_broker: Broker, cfg: Config, settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, cfg, api_broker)) as c:
        yield c


auth = bearer_by_name(TOKENS)


def shape(resp: httpx.Response, request_id: str) -> dict[str, Any]:
    body = resp.json()
    if "error" in body:
        out = {"error": body["error"], "detail": body["detail"].replace(request_id, "ID")}
        if "request" in body:
            out["request_status"] = body["request"]["status"]
        return {"status": resp.status_code, **out}
    decision = body.get("decision") or {}
    return {
        "status": resp.status_code,
        "request_status": body["status"],
        "queue": body["queue"],
        "outcome": decision.get("outcome"),
        "decided_by": decision.get("decided_by"),
        "args": decision.get("args"),
        "votes": sorted(v["by"] for v in body.get("approvals", [])),
    }


# name: (request fields, [(who, body)...] sent in turn; the last answer is compared)
Case = tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]
CASES: dict[str, Case] = {
    "approve": ({}, [("alice", {"outcome": "approved"})]),
    "reject with reason": ({}, [("alice", {"outcome": "rejected", "reason": "no"})]),
    "harmless repeat": ({}, [("alice", {"outcome": "approved"})] * 2),
    "lost to another": (
        {},
        [("alice", {"outcome": "approved"}), ("carol", {"outcome": "rejected"})],
    ),
    "allowed role met": ({"allowed_roles": ["ops"]}, [("carol", {"outcome": "approved"})]),
    "allowed role missing: invisible 404": (
        {"allowed_roles": ["ops"]},
        [("alice", {"outcome": "approved"})],
    ),
    "queue role missing: invisible 404": (
        {"queue": "senior"},
        [("alice", {"outcome": "approved"})],
    ),
    "queue role met": ({"queue": "senior"}, [("bob", {"outcome": "approved"})]),
    "channel not in queue: 403": ({"queue": "slack_only"}, [("alice", {"outcome": "approved"})]),
    "requester creator: 403": ({"created_by": "agent"}, [("agent", {"outcome": "approved"})]),
    "creator approves: 403": ({"created_by": "alice"}, [("alice", {"outcome": "approved"})]),
    "creator rejects": ({"created_by": "alice"}, [("alice", {"outcome": "rejected"})]),
    "admin creator approves": (
        {"created_by": "admin"},
        [("admin", {"outcome": "approved"})],
    ),
    "admin in a queue without inbox": (
        {"queue": "slack_only"},
        [("admin", {"outcome": "approved"})],
    ),
    "stale args_hash": ({}, [("alice", {"outcome": "approved", "args_hash": "0" * 64})]),
    "modified, no schema": ({}, [("alice", {"outcome": "modified", "args": {"amount": 7}})]),
    "modified, meets schema": (
        {"args_schema": SCHEMA},
        [("alice", {"outcome": "modified", "args": {"amount": 7}})],
    ),
    "modified, breaks schema": (
        {"args_schema": SCHEMA},
        [("alice", {"outcome": "modified", "args": {"amount": 700}})],
    ),
    "approve a question": ({"kind": "question"}, [("alice", {"outcome": "approved"})]),
    "answer a question": ({"kind": "question"}, [("alice", {"outcome": "answered", "answer": 1})]),
    "escalate": ({}, [("alice", {"outcome": "escalated"})]),
    "escalate twice: a repeat": ({}, [("carol", {"outcome": "escalated"})] * 2),
    "first vote of two": ({"queue": "pair"}, [("alice", {"outcome": "approved"})]),
    "repeated vote": ({"queue": "pair"}, [("alice", {"outcome": "approved"})] * 2),
    "quorum met": (
        {"queue": "pair"},
        [("alice", {"outcome": "approved"}), ("carol", {"outcome": "approved"})],
    ),
    "vote then reject": (
        {"queue": "pair"},
        [("alice", {"outcome": "approved"}), ("carol", {"outcome": "rejected"})],
    ),
    "vote again after the quorum": (
        {"queue": "pair"},
        [("alice", {"outcome": "approved"}), ("carol", {"outcome": "approved"})]
        + [("alice", {"outcome": "approved"})],
    ),
}
NAMED = re.compile(r"\b([1-5]\d\d)\b")
STATUSES = {  # the cases whose names don't say it
    "harmless repeat": 200,
    "lost to another": 409,
    "stale args_hash": 422,
    "modified, breaks schema": 422,
    "approve a question": 422,
    "escalate twice: a repeat": 200,
    "vote again after the quorum": 200,  # the same approval again: harmless
}


def named_status(case: str) -> int:
    """The HTTP status a case's name states (`...: 403`), else STATUSES', else 200."""
    found = NAMED.search(case)
    return int(found.group(1)) if found else STATUSES.get(case, 200)


def make(broker: Broker, **fields: Any) -> Request:
    return broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}, **fields))


@pytest.mark.parametrize("case", list(CASES))
def test_each_case_is_answered_as_the_judge_decides(
    case: str, client: TestClient, api_broker: Broker
) -> None:
    fields, sends = CASES[case]
    req = make(api_broker, **fields)
    for who, body in sends:
        before = api_broker.get_request(req.id)
        resp = client.post(f"/v1/requests/{req.id}/decision", json=body, headers=auth(who))
    answer = shape(resp, req.id)
    assert answer["status"] == named_status(case), answer
    if answer["status"] >= 400 and answer["status"] != 409:  # refused: nothing written
        assert api_broker.get_request(req.id).model_dump() == before.model_dump()


def signed(body: bytes, msg_id: str) -> dict[str, str]:
    now = datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, body.decode()),
        "content-type": "application/json",
    }


# name: (request fields, reply, status of the reply, status of its replay: a spent webhook-id
# is 409 `replayed`, one whose decision was refused was never spent, a vote again is a repeat)
REPLIES: dict[str, tuple[dict[str, Any], dict[str, Any], int, int]] = {
    "approve": ({}, {"outcome": "approved"}, 200, 409),
    "by a person": ({}, {"outcome": "rejected", "decided_by": "dee"}, 200, 409),
    "creator through the webhook": ({"created_by": "dee"}, {"outcome": "approved", "decided_by": "dee"}, 403, 403),
    "queue without the webhook": ({"queue": "senior"}, {"outcome": "approved"}, 403, 403),
    "a vote": ({"queue": "pair"}, {"outcome": "approved", "decided_by": "dee"}, 200, 200),
    "escalate": ({}, {"outcome": "escalated"}, 200, 200),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REPLIES))
def test_a_webhook_reply_is_judged_and_its_replay_refused(
    case: str, client: TestClient, api_broker: Broker
) -> None:
    fields, reply, status, again = REPLIES[case]
    req = make(api_broker, **fields)
    body = json.dumps({"request_id": req.id, **reply}).encode()
    headers = signed(body, f"msg_route_{case}")
    first = client.post("/v1/webhooks/ops/replies", content=body, headers=headers)
    replay = client.post("/v1/webhooks/ops/replies", content=body, headers=headers)
    assert first.status_code == status, first.text
    assert replay.status_code == again, replay.text
    if again == 409:
        assert replay.json()["error"] == "replayed"


# ---- least privilege: a request the caller can't see does not exist for it ------------------


@pytest.mark.parametrize("action", ["decision", "ack"])
def test_decide_and_ack_answer_404_for_a_request_the_caller_cannot_see(
    action: str, client: TestClient, api_broker: Broker
) -> None:
    hidden = make(api_broker, allowed_roles=["ops"])  # alice (finance) may not see it
    get = client.get(f"/v1/requests/{hidden.id}", headers=auth("alice"))
    resp = client.post(
        f"/v1/requests/{hidden.id}/{action}", json={"outcome": "approved"}, headers=auth("alice")
    )
    missing = client.post(
        f"/v1/requests/req_nope/{action}", json={"outcome": "approved"}, headers=auth("alice")
    )
    assert get.status_code == resp.status_code == missing.status_code == 404
    assert resp.json() == get.json()  # word for word: nothing says it exists
    assert resp.json()["error"] == "not_found" and missing.json()["error"] == "not_found"
    assert api_broker.get_request(hidden.id).is_pending
    assert api_broker.get_request(hidden.id).history == []  # no ack recorded either


@pytest.mark.parametrize("action", ["decision", "ack"])
def test_a_visible_request_the_caller_may_not_decide_is_still_403(
    action: str, client: TestClient, api_broker: Broker
) -> None:
    fast = client
    own = make(api_broker, created_by="agent")  # the agent sees what it asked for
    through = make(api_broker, queue="slack_only")  # alice may decide it, not through inbox
    for who, req in (("agent", own), ("alice", through)):
        assert fast.get(f"/v1/requests/{req.id}", headers=auth(who)).status_code == 200
        resp = fast.post(
            f"/v1/requests/{req.id}/{action}", json={"outcome": "approved"}, headers=auth(who)
        )
        assert resp.status_code == 403 and resp.json()["error"] == "forbidden", resp.text


# ---- concurrency: the first decision wins, over a real server and real threads ---------------


@pytest.fixture
def server(api_broker: Broker, cfg: Config, settings: Settings) -> Iterator[str]:
    with ServerThread(create_app(settings, cfg, api_broker)) as running:
        yield running.url


def race(url: str, request_id: str, sends: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    barrier = threading.Barrier(len(sends))
    out: list[Any] = [None] * len(sends)

    def send(i: int) -> Callable[[], None]:
        def run() -> None:
            who, body = sends[i]
            with httpx.Client(base_url=url, headers=auth(who)) as http:
                barrier.wait()
                out[i] = http.post(f"/v1/requests/{request_id}/decision", json=body)

        return run

    threads = [threading.Thread(target=send(i)) for i in range(len(sends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_concurrent_decisions_have_one_winner(server: str, api_broker: Broker) -> None:
    for _ in range(5):
        req = make(api_broker)
        sends = [("carol", {"outcome": "approved"}), ("alice", {"outcome": "rejected"})] * 4
        answers = race(server, req.id, sends)
        stored = api_broker.get_request(req.id)
        assert stored.decision is not None
        winner = (stored.decision.decided_by, stored.decision.outcome.value)
        for (who, body), resp in zip(sends, answers, strict=True):
            mine = (who, body["outcome"]) == winner
            assert resp.status_code == (200 if mine else 409), resp.text
            assert resp.json().get("request", resp.json())["decision"]["decided_by"] == winner[0]


def test_concurrent_votes_count_each_person_once(server: str, api_broker: Broker) -> None:
    req = make(api_broker, queue="pair")
    sends = [("alice", {"outcome": "approved"}), ("carol", {"outcome": "approved"})] * 4
    answers = race(server, req.id, sends)
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    stored = api_broker.get_request(req.id)
    assert stored.status.value == "approved"
    assert sorted(v.by for v in stored.approvals) == ["alice", "carol"]


# ---- Redis trouble -------------------------------------------------------


def test_a_flushed_script_cache_is_reloaded(client: TestClient, api_broker: Broker) -> None:
    fast = client
    first = make(api_broker)
    assert fast.post(f"/v1/requests/{first.id}/decision", json={"outcome": "approved"},
                     headers=auth("alice")).status_code == 200  # fmt: skip
    api_broker.redis.script_flush()  # a restarted or failed-over Redis: NOSCRIPT on the next call
    req = make(api_broker)
    resp = fast.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=auth("alice")
    )
    assert resp.status_code == 200 and resp.json()["status"] == "approved"


def test_an_unreachable_redis_is_503_not_a_traceback(cfg: Config, settings: Settings) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = Broker(Redis(port=port, socket_connect_timeout=1), cfg, prefix="t:")
    with TestClient(create_app(settings, cfg, gone)) as client:
        resp = client.post(
            "/v1/requests/req_x/decision", json={"outcome": "approved"}, headers=auth("alice")
        )
        reply = client.post(
            "/v1/webhooks/ops/replies",
            content=(body := json.dumps({"request_id": "req_x", "outcome": "approved"}).encode()),
            headers=signed(body, "msg_gone"),
        )
    for answer in (resp, reply):
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "unavailable"
