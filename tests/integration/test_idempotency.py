"""`Idempotency-Key` on POST /v1/requests and POST /v1/runs: the same key and body answer the
original, another body is refused, concurrent creates with one key make one, per principal."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from rq import Queue
from rq.serializers import JSONSerializer

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.starting import RUN_QUEUE
from tests.support.auth import person

ADMIN = "tok-admin"
ALICE = {"Authorization": "Bearer tok-alice"}
DAVE = {"Authorization": "Bearer tok-dave"}
BODY = {"tool_name": "refund", "args": {"order_id": "A1", "amount": 120}}


def key(k: str, who: dict[str, str] = ALICE) -> dict[str, str]:
    return {**who, "Idempotency-Key": k}


API_CONFIG = {
    "approvers": {
        "alice": person("tok-alice", ["requester"]),
        "dave": person("tok-dave", ["requester"]),
    }
}


@pytest.fixture
def api_settings() -> Settings:
    return Settings(admin_token=ADMIN)


def test_same_key_and_body_answer_the_original(client: TestClient, api_broker: Broker) -> None:
    first = client.post("/v1/requests", json=BODY, headers=key("k1"))
    assert first.status_code == 201, first.text
    # the same body, written differently (key order), is the same body
    again = client.post(
        "/v1/requests", json={"args": {"amount": 120, "order_id": "A1"}, "tool_name": "refund"},
        headers=key("k1"),
    )  # fmt: skip
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    assert len(api_broker.list_requests()) == 1
    # another key is another request; no key at all is always a new one
    other = client.post("/v1/requests", json=BODY, headers=key("k2"))
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert client.post("/v1/requests", json=BODY, headers=ALICE).status_code == 201
    assert len(api_broker.list_requests()) == 3


def test_replay_answers_the_request_as_it_stands_now(
    client: TestClient, api_broker: Broker
) -> None:
    first = client.post("/v1/requests", json=BODY, headers=key("k1")).json()
    client.post(
        f"/v1/requests/{first['id']}/decision",
        json={"outcome": "approved"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    again = client.post("/v1/requests", json=BODY, headers=key("k1"))
    assert again.status_code == 200
    assert again.json()["status"] == "approved"


def test_same_key_with_another_body_is_refused(client: TestClient, api_broker: Broker) -> None:
    assert client.post("/v1/requests", json=BODY, headers=key("k1")).status_code == 201
    resp = client.post(
        "/v1/requests", json={**BODY, "args": {"order_id": "A1", "amount": 9000}}, headers=key("k1")
    )
    assert resp.status_code == 422
    assert resp.json()["error"] == "idempotency_mismatch"
    assert set(resp.json()) == {"error", "detail"}
    assert len(api_broker.list_requests()) == 1


def test_keys_are_per_principal(client: TestClient, api_broker: Broker) -> None:
    a = client.post("/v1/requests", json=BODY, headers=key("shared"))
    d = client.post(
        "/v1/requests", json={**BODY, "tool_name": "other"}, headers=key("shared", DAVE)
    )
    assert a.status_code == d.status_code == 201
    assert a.json()["id"] != d.json()["id"]


def test_a_failed_create_is_not_remembered(client: TestClient, api_broker: Broker) -> None:
    bad = client.post("/v1/requests", json={**BODY, "queue": "nowhere"}, headers=key("k1"))
    assert bad.status_code == 422 and bad.json()["error"] == "unknown_queue"
    good = client.post("/v1/requests", json=BODY, headers=key("k1"))
    assert good.status_code == 201, good.text


def test_a_bad_key_is_422(client: TestClient) -> None:
    resp = client.post("/v1/requests", json=BODY, headers=key("x" * 300))
    assert resp.status_code == 422 and set(resp.json()) == {"error", "detail"}


def test_twenty_threads_one_key_make_one_request(
    cfg: Config, api_broker: Broker, api_settings: Settings
) -> None:
    n = 20
    results: list[tuple[int, Any]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n)

    def create(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            barrier.wait()
            resp = http.post("/v1/requests", json=BODY, headers=key("race"))
            with lock:
                results.append((resp.status_code, resp.json()))

    with ServerThread(create_app(api_settings, cfg, api_broker)) as server:
        threads = [threading.Thread(target=create, args=(server.url,)) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(results) == n
    assert sorted(code for code, _ in results) == [200] * (n - 1) + [201]
    assert len({body["id"] for _, body in results}) == 1
    assert len(api_broker.list_requests()) == 1
    assert api_broker.counts().get("pending:default") == 1


def test_runs_honour_the_key(client: TestClient, api_broker: Broker) -> None:
    api_broker.redis.sadd(api_broker.keys.agents, "refunds")
    body = {"agent": "refunds", "prompt": "Refund $120 on A103"}
    first = client.post("/v1/runs", json=body, headers=key("run-1"))
    assert first.status_code == 202, first.text
    again = client.post("/v1/runs", json=body, headers=key("run-1"))
    assert again.status_code == 200
    assert again.json() == first.json()
    queue = Queue(RUN_QUEUE, connection=api_broker.redis, serializer=JSONSerializer)
    assert len(queue.job_ids) == 1
    other = client.post("/v1/runs", json={**body, "prompt": "something else"}, headers=key("run-1"))
    assert other.status_code == 422 and other.json()["error"] == "idempotency_mismatch"
    # the scope is the route: a request may use the same key as a run
    assert client.post("/v1/requests", json=BODY, headers=key("run-1")).status_code == 201


def test_a_crashed_create_frees_its_key_soon(
    client: TestClient, api_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.idempotency import CLAIM_TTL_S, TTL_S

    real = api_broker.requests.create_request
    claim_ttls: list[int] = []

    def create(*a: Any, **kw: Any) -> Any:  # the claim, as a crash right now would leave it
        claim_ttls.extend(api_broker.redis.ttl(k) for k in api_broker.redis.keys("*idem:*"))
        return real(*a, **kw)

    monkeypatch.setattr(api_broker.requests, "create_request", create)
    resp = client.post("/v1/requests", json=BODY, headers=key("crashy"))
    assert resp.status_code == 201
    assert claim_ttls and all(0 < t <= CLAIM_TTL_S for t in claim_ttls)
    [k] = api_broker.redis.keys("*idem:*")
    assert api_broker.redis.ttl(k) > TTL_S - 60  # the id, once written, is kept 24 h
