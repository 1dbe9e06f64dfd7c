"""The REST API: auth and roles, requests, decisions and their status codes, runs, metrics,
health, the 50-way decision race over real HTTP, and server-sent events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from rq import Queue
from rq.serializers import JSONSerializer

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest, Request
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.starting import RUN_QUEUE
from tests.support.auth import bearer, person
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker, single_only  # noqa: F401 - redis, broker, api_broker on both backends
from tests.support.resumes import resumes_of

ADMIN = "tok-admin-of-the-api-tests-0123"


ALICE, BOB, CAROL = bearer("tok-alice"), bearer("tok-bob"), bearer("tok-carol")


def api_config(extra_approvers: dict[str, Any] | None = None) -> Config:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"], "timeout_s": 600, "escalate_to": "managers"},
                "managers": {"channels": ["inbox"], "timeout_s": 1800},
            },
            "approvers": {
                "alice": {
                    "token_sha256": hash_token("tok-alice"),
                    "roles": ["finance", "requester"],
                },
                "bob": person("tok-bob", ["ops"]),
                "carol": person("tok-carol", []),
                **(extra_approvers or {}),
            },
            "webhooks": {
                "ops": {
                    "url": "http://127.0.0.1:9/hook",
                    "secret": "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1vcHMtd2ViaG9vayE=",
                }
            },
        }
    )


@pytest.fixture
def cfg() -> Config:
    return api_config()


@pytest.fixture
def api_settings() -> Settings:
    return Settings(admin_token=ADMIN)


def make(broker: Broker, **kw: Any) -> Request:
    kw.setdefault("tool_name", "refund")
    kw.setdefault("args", {"order_id": "A1", "amount": 120})
    return broker.create_request(NewRequest(**kw))


def assert_error(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert isinstance(body["error"], str) and isinstance(body["detail"], str), body
    if code is not None:
        assert body["error"] == code, body
    return body  # type: ignore[no-any-return]


# ---- health and plain errors ------------------------------------------------------------


def test_healthz_answers_when_redis_does(client: TestClient) -> None:
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}


def test_redis_down_gives_503_json_not_500(cfg: Config) -> None:
    dead_redis = Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    dead = Broker(dead_redis, cfg, prefix="t:")
    with TestClient(create_app(Settings(admin_token=ADMIN), cfg, dead)) as c:
        assert_error(c.get("/healthz"), 503, "unavailable")
        assert_error(c.get("/v1/requests", headers=bearer(ADMIN)), 503, "unavailable")
        metrics = c.get("/metrics")
        assert metrics.status_code == 200 and "approval_broker_redis_up 0.0" in metrics.text


def test_unknown_route_and_method_are_json_errors(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing"), 404, "not_found")
    assert_error(client.put("/v1/requests", headers=bearer(ADMIN)), 405, "method_not_allowed")


# ---- auth --------------------------------------------------------------------------------


def test_missing_or_bad_token_is_401_with_www_authenticate(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    for headers in ({}, bearer("nope"), {"Authorization": "Basic YTpi"}):
        resp = client.post(
            f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=headers
        )
        body = assert_error(resp, 401, "unauthorized")
        assert resp.headers["www-authenticate"] == "Bearer"
        assert "nope" not in json.dumps(body)
    assert api_broker.get_request(req.id).is_pending


def test_every_read_endpoint_needs_a_token(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    for path in ("/v1/requests", f"/v1/requests/{req.id}", "/v1/runs/x", "/v1/events"):
        assert_error(client.get(path), 401, "unauthorized")


# ---- creating, listing, reading ---------------------------------------------------------


def test_create_request_needs_requester_role(client: TestClient, api_broker: Broker) -> None:
    body = {"tool_name": "deploy", "args": {"env": "prod"}, "allowed_roles": ["ops"]}
    assert_error(client.post("/v1/requests", json=body), 401)
    assert_error(client.post("/v1/requests", json=body, headers=BOB), 403, "forbidden")
    resp = client.post("/v1/requests", json=body, headers=ALICE)
    assert resp.status_code == 201, resp.text
    created = resp.json()
    assert created["status"] == "pending" and created["run_id"] is None
    assert created["tool_name"] == "deploy" and created["allowed_roles"] == ["ops"]
    assert api_broker.get_request(created["id"]).args == {"env": "prod"}
    admin = client.post("/v1/requests", json=body, headers=bearer(ADMIN))
    assert admin.status_code == 201


def test_create_request_with_callback_and_bad_input(client: TestClient) -> None:
    ok = client.post(
        "/v1/requests",
        json={"tool_name": "t", "callback": "ops", "kind": "question", "timeout_s": 5},
        headers=ALICE,
    )
    assert ok.status_code == 201 and ok.json()["callback"] == "ops"
    bad = [
        ({"tool_name": "t", "queue": "nowhere"}, "unknown_queue"),
        ({"tool_name": "t", "callback": "nowhere"}, "unknown_webhook"),
        ({"tool_name": ""}, "invalid"),
        ({"tool_name": "t", "kind": "poll"}, "invalid"),
        ({"tool_name": "t", "timeout_s": -1}, "invalid"),
        ({"tool_name": "t", "surprise": 1}, "invalid"),
    ]
    for body, code in bad:
        assert_error(client.post("/v1/requests", json=body, headers=ALICE), 422, code)
    for raw in ('{"tool_name": "t", "args": {"x": 1e400}}', '{"tool_name": "t", "data": NaN}'):
        resp = client.post(
            "/v1/requests",
            content=raw,
            headers={**ALICE, "Content-Type": "application/json"},
        )
        assert "finite" in assert_error(resp, 422, "invalid")["detail"]
    surrogate = '{"tool_name": "t", "prompt": "\\ud800"}'
    resp = client.post(
        "/v1/requests", content=surrogate, headers={**ALICE, "Content-Type": "application/json"}
    )
    assert_error(resp, 422, "invalid")
    broken = client.post(
        "/v1/requests", content=b"{not json", headers={**ALICE, "Content-Type": "application/json"}
    )
    assert_error(broken, 422, "invalid")
    assert [r["id"] for r in client.get("/v1/requests", headers=ALICE).json()] == [ok.json()["id"]]


def test_list_filters_and_get_one(client: TestClient, api_broker: Broker) -> None:
    a = make(api_broker)
    b = make(api_broker, queue="managers")
    c = make(api_broker)
    api_broker.decide(c.id, _approve(), decided_by="x")
    ids = lambda resp: {r["id"] for r in resp.json()}  # noqa: E731
    assert ids(client.get("/v1/requests", headers=CAROL)) == {a.id, b.id, c.id}
    assert ids(client.get("/v1/requests?status=pending", headers=CAROL)) == {a.id, b.id}
    assert ids(client.get("/v1/requests?status=approved", headers=CAROL)) == {c.id}
    assert ids(client.get("/v1/requests?queue=managers", headers=CAROL)) == {b.id}
    assert len(client.get("/v1/requests?limit=1", headers=CAROL).json()) == 1
    assert_error(client.get("/v1/requests?status=maybe", headers=CAROL), 422, "invalid")
    assert_error(client.get("/v1/requests?limit=0", headers=CAROL), 422, "invalid")
    one = client.get(f"/v1/requests/{c.id}", headers=CAROL).json()
    assert one["status"] == "approved" and one["decision"]["decided_by"] == "x"
    assert_error(client.get("/v1/requests/req_nope", headers=CAROL), 404, "not_found")


def _approve() -> Any:
    from broker.domain.models import Decision, Outcome

    return Decision(outcome=Outcome.approved)


# ---- deciding ------------------------------------------------------------------------------


def test_decide_200_with_request_and_decided_by_is_the_approver(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    resp = client.post(
        f"/v1/requests/{req.id}/decision",
        json={"outcome": "approved", "args_hash": req.args_hash},
        headers=CAROL,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"] == req.id and body["status"] == "approved"
    assert body["decision"]["decided_by"] == "carol" and body["decision"]["decided_at"]
    assert api_broker.get_request(req.id).status.value == "approved"


def test_second_decision_is_409_with_the_winner(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    first = client.post(
        f"/v1/requests/{req.id}/decision",
        json={"outcome": "rejected", "reason": "too much"},
        headers=ALICE,
    )
    assert first.status_code == 200
    for headers, body in (
        (BOB, {"outcome": "approved"}),
        (ALICE, {"outcome": "approved"}),  # the same approver changing their mind
    ):
        resp = client.post(f"/v1/requests/{req.id}/decision", json=body, headers=headers)
        conflict = assert_error(resp, 409, "conflict")
        assert conflict["request"]["status"] == "rejected"
        assert conflict["request"]["decision"]["decided_by"] == "alice"
        assert conflict["request"]["decision"]["reason"] == "too much"


def test_same_approver_repeating_the_same_decision_is_200(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    body = {"outcome": "modified", "args": {"order_id": "A1", "amount": 100}}
    first = client.post(f"/v1/requests/{req.id}/decision", json=body, headers=ALICE)
    again = client.post(f"/v1/requests/{req.id}/decision", json=body, headers=ALICE)
    assert first.status_code == again.status_code == 200
    assert again.json()["decision"] == first.json()["decision"]
    assert (
        api_broker.redis.xlen(api_broker.keys.of_request(req.id).stream("default")) == 2
    )  # created + decided


def test_roles_are_enforced_404(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker, allowed_roles=["finance"])
    for headers in (BOB, CAROL):  # they may not see it: told it does not exist, as GET does
        resp = client.post(
            f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=headers
        )
        assert_error(resp, 404, "not_found")
    assert api_broker.get_request(req.id).is_pending
    ok = client.post(f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=ALICE)
    assert ok.status_code == 200
    admin_req = make(api_broker, allowed_roles=["nobody-has-this"])
    admin = client.post(
        f"/v1/requests/{admin_req.id}/decision", json={"outcome": "approved"}, headers=bearer(ADMIN)
    )
    assert admin.status_code == 200 and admin.json()["decision"]["decided_by"] == "admin"


def test_decide_unknown_request_is_404(client: TestClient) -> None:
    resp = client.post(
        "/v1/requests/req_nope/decision", json={"outcome": "approved"}, headers=ALICE
    )
    assert_error(resp, 404, "not_found")


@pytest.mark.parametrize(
    ("kind", "body", "code"),
    [
        ("approval", {"outcome": "modified"}, "invalid"),
        ("approval", {"outcome": "answered", "answer": "yes"}, "wrong_kind"),
        ("question", {"outcome": "approved"}, "wrong_kind"),
        ("approval", {"outcome": "escalated", "target": "nowhere"}, "unknown_queue"),
        ("approval", {"outcome": "approved", "args_hash": "0" * 64}, "stale_args"),
        ("approval", {"outcome": "timed_out"}, "invalid"),
        ("approval", {"outcome": "maybe"}, "invalid"),
        ("approval", {"outcome": "approved", "decided_by": "mallory"}, "invalid"),
        ("approval", {"outcome": "approved", "target": "managers"}, "invalid"),
        ("approval", {"outcome": "answered", "answer": 1e308 * 10}, "invalid"),
        ("approval", [], "invalid"),
    ],
)
def test_decisions_that_cannot_apply_are_422_and_change_nothing(
    client: TestClient, api_broker: Broker, kind: str, body: Any, code: str
) -> None:
    req = make(api_broker, kind=kind)
    raw = json.dumps(body)  # Infinity for the non-finite case: what a sloppy client sends
    resp = client.post(
        f"/v1/requests/{req.id}/decision",
        content=raw,
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert_error(resp, 422, code)
    after = api_broker.get_request(req.id)
    assert after.is_pending and after.decision is None and after.queue == "default"


def test_answer_a_question_and_modify_an_approval(client: TestClient, api_broker: Broker) -> None:
    q = make(api_broker, kind="question", tool_name="ask")
    resp = client.post(
        f"/v1/requests/{q.id}/decision",
        json={"outcome": "answered", "answer": {"choice": "B"}},
        headers=CAROL,
    )
    assert resp.status_code == 200 and resp.json()["decision"]["answer"] == {"choice": "B"}
    a = make(api_broker)
    resp = client.post(
        f"/v1/requests/{a.id}/decision",
        json={"outcome": "modified", "args": {"order_id": "A1", "amount": 50}},
        headers=CAROL,
    )
    assert resp.json()["status"] == "modified"
    assert resp.json()["decision"]["args"] == {"order_id": "A1", "amount": 50}


def test_escalate_default_target_repeat_and_no_target(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    url = f"/v1/requests/{req.id}/decision"
    first = client.post(url, json={"outcome": "escalated", "reason": "big"}, headers=ALICE)
    assert first.status_code == 200
    assert first.json()["status"] == "pending" and first.json()["queue"] == "managers"
    assert first.json()["history"][-1]["by"] == "alice"
    again = client.post(url, json={"outcome": "escalated", "reason": "big"}, headers=ALICE)
    assert again.status_code == 200 and again.json()["queue"] == "managers"
    assert len(again.json()["history"]) == 1
    assert_error(client.post(url, json={"outcome": "escalated"}, headers=BOB), 422, "no_target")
    done = client.post(url, json={"outcome": "approved"}, headers=BOB)
    assert done.status_code == 200 and done.json()["status"] == "approved"


def test_timed_out_request_is_409_timed_out(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker, queue="managers", timeout_s=1)
    api_broker.sweep(now=req.expires_at.timestamp() + 1)
    resp = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "approved"}, headers=ALICE
    )
    body = assert_error(resp, 409, "conflict")
    assert body["request"]["status"] == "timed_out"
    assert body["request"]["decision"]["decided_by"] == "sweeper"


# ---- runs --------------------------------------------------------------------------------


def test_runs_start_read_and_errors(client: TestClient, api_broker: Broker) -> None:
    body = {"agent": "refunds", "prompt": "refund A1"}
    assert_error(client.post("/v1/runs", json=body, headers=BOB), 403, "forbidden")
    assert_error(client.post("/v1/runs", json=body, headers=ALICE), 422, "unknown_agent")
    api_broker.redis.sadd(api_broker.keys.agents, "refunds")
    resp = client.post("/v1/runs", json=body, headers=ALICE)
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["run_id"]
    queue = Queue(RUN_QUEUE, connection=api_broker.store.rq_redis, serializer=JSONSerializer)
    assert f"run-{run_id}-0" in queue.job_ids
    assert_error(client.get(f"/v1/runs/{run_id}", headers=CAROL), 404, "not_found")  # not hers
    run = client.get(f"/v1/runs/{run_id}", headers=ALICE)
    assert run.status_code == 200
    assert run.json()["status"] == "queued" and run.json()["round"] == 0
    assert_error(client.get("/v1/runs/run_nope", headers=CAROL), 404, "not_found")
    assert_error(client.post("/v1/runs", json={"agent": "refunds"}, headers=ALICE), 422)


# ---- metrics -------------------------------------------------------------------------------


def _sample(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        base, _, rest = metric.partition("{")
        got = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
        if base == name and got == want:
            return float(value)
    return None


def test_metrics_report_requests_deliveries_dead_letters_and_latency(
    client: TestClient, api_broker: Broker
) -> None:
    a, b = make(api_broker), make(api_broker)
    make(api_broker, queue="managers")
    client.post(f"/v1/requests/{a.id}/decision", json={"outcome": "approved"}, headers=ALICE)
    client.post(f"/v1/requests/{b.id}/decision", json={"outcome": "rejected"}, headers=ALICE)
    api_broker.redis.hincrby(api_broker.keys.stats, "delivered:slack", 3)
    api_broker.redis.hincrby(api_broker.keys.stats, "failed:webhook", 2)
    api_broker.redis.hincrby(api_broker.keys.stats, "parked:slack", 4)
    api_broker.dead_letter("webhook:ops", "HTTP 500")
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert _sample(text, "approval_broker_requests", status="approved", queue="default") == 1
    assert _sample(text, "approval_broker_requests", status="rejected", queue="default") == 1
    assert _sample(text, "approval_broker_requests", status="pending", queue="managers") == 1
    assert _sample(text, "approval_broker_deliveries_total", channel="slack") == 3
    assert _sample(text, "approval_broker_delivery_failures_total", channel="webhook") == 2
    assert _sample(text, "approval_broker_parked_deliveries_total", channel="slack") == 4
    assert _sample(text, "approval_broker_dead_letters") == 1
    count = _sample(text, "approval_broker_decision_latency_seconds_count", channel="rest")
    assert count == 2


# ---- the race ------------------------------------------------------------------------------


def test_fifty_concurrent_http_decisions_one_wins(redis: Redis) -> None:
    """50 approvers decide one request at once over real HTTP: one 200, 49 x 409, one winner."""
    n = 50
    approvers = {f"p{i}": {"token_sha256": hash_token(f"tok-p{i}")} for i in range(n)}
    cfg = api_config(approvers)
    broker = Broker(redis, cfg, prefix="t:")
    run = broker.create_run("agent", "go")
    (req,) = broker.create_round(run.id, 1, [NewRequest(tool_name="refund", args={"x": 1})])
    barrier = threading.Barrier(n)
    results: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def decide(i: int, base_url: str) -> None:
        outcome = "approved" if i % 2 else "rejected"
        # all released at once, each on a connection of its own; not connected before the
        # barrier: a connection idle past the server's keep-alive while slow threads start
        # would be closed under the request (a reset, not an answer)
        barrier.wait()
        with httpx.Client(base_url=base_url, timeout=30) as http:
            resp = http.post(
                f"/v1/requests/{req.id}/decision",
                json={"outcome": outcome},
                headers=bearer(f"tok-p{i}"),
            )
        with lock:
            results.append((resp.status_code, resp.json()))

    app = create_app(Settings(admin_token=ADMIN), cfg, broker)
    with ServerThread(app) as server:
        threads = [threading.Thread(target=decide, args=(i, server.url)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    statuses = sorted(code for code, _ in results)
    assert statuses == [200] + [409] * (n - 1)
    (winner,) = [body for code, body in results if code == 200]
    winning = winner["decision"]
    for code, body in results:
        if code == 409:
            assert body["error"] == "conflict"
            assert body["request"]["decision"] == winning
    stored = broker.get_request(req.id)
    assert stored.decision is not None and stored.decision.decided_by == winning["decided_by"]
    assert resumes_of(broker, run.id) == 1


# ---- server-sent events ----------------------------------------------------------------------


def test_events_stream_created_decided_escalated_timed_out(api_broker: Broker, cfg: Config) -> None:
    app = create_app(Settings(admin_token=ADMIN), cfg, api_broker)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        assert_error(http.get("/v1/events?queue=nowhere", headers=ALICE), 422, "unknown_queue")
        with http.stream("GET", "/v1/events", headers=ALICE) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = resp.iter_lines()
            assert next(lines) == ": connected"
            a = make(api_broker)
            api_broker.decide(a.id, _approve(), decided_by="x")
            b = make(api_broker, timeout_s=1)
            api_broker.escalate(b.id, decided_by="x")
            c = make(api_broker, queue="managers", timeout_s=1)
            api_broker.sweep(now=c.expires_at.timestamp() + 1)
            events: list[tuple[str, dict[str, Any]]] = []
            event = None
            for line in lines:
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event:
                    events.append((event, json.loads(line.removeprefix("data: "))))
                    if len(events) == 6:
                        break
    got = [(e, d["id"]) for e, d in events]
    expected = [
        ("approval.requested", a.id),
        ("approval.decided", a.id),
        ("approval.requested", b.id),
        ("approval.escalated", b.id),
        ("approval.requested", c.id),
        ("approval.timed_out", c.id),
    ]
    if isinstance(api_broker.redis, RedisCluster):
        # A cluster orders one request's events, not events of requests in other partitions.
        assert sorted(got) == sorted(expected)
        for rid in (a.id, b.id, c.id):
            assert [e for e, i in got if i == rid] == [e for e, i in expected if i == rid]
    else:
        assert got == expected
    by_name = dict(events)  # one event of each of these names
    assert by_name["approval.decided"]["status"] == "approved"
    assert by_name["approval.escalated"]["queue"] == "managers"
    assert by_name["approval.timed_out"]["status"] == "timed_out"


# ---- the CLI role --------------------------------------------------------------------------


def test_cli_api_command_serves_the_app(backend_env: dict[str, str], tmp_path: Any) -> None:
    """`approval-broker api --port 0` prints where it listens and answers there."""
    env = {
        **os.environ,
        **backend_env,
        "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN,
        "APPROVAL_BROKER_DATA_DIR": str(tmp_path),
    }
    env.pop("APPROVAL_BROKER_CONFIG", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from approval_broker.cli import main; main()",
            "api",
            "--port",
            "0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("API listening on http://127.0.0.1:"), line
        url = line.removeprefix("API listening on ")
        assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}
        listed = httpx.get(f"{url}/v1/requests", headers=bearer(ADMIN), timeout=5)
        assert listed.status_code == 200 and listed.json() == []
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_requester_alone_can_not_decide(
    client: TestClient, api_broker: Broker, cfg: Config
) -> None:
    """An agent's token (role `requester` only) may ask, never approve its own tool calls."""
    cfg.approvers["svc"] = cfg.approvers["bob"].model_copy(update=person("tok-svc", ["requester"]))
    created = client.post("/v1/requests", json={"tool_name": "wire"}, headers=bearer("tok-svc"))
    assert created.status_code == 201
    rid = created.json()["id"]
    resp = client.post(
        f"/v1/requests/{rid}/decision", json={"outcome": "approved"}, headers=bearer("tok-svc")
    )
    assert resp.status_code == 403 and "'requester' alone only asks" in resp.json()["detail"]
    assert api_broker.get_request(rid).is_pending
    # alice asks too, but she is also in finance: she is an approver
    assert (
        client.post(
            f"/v1/requests/{rid}/decision", json={"outcome": "approved"}, headers=ALICE
        ).status_code
        == 200
    )


def test_repeated_escalation_after_a_delivery_is_still_a_repeat(
    client: TestClient, api_broker: Broker
) -> None:
    from broker.domain.models import HistoryEntry, utcnow

    req = make(api_broker)
    first = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "escalated"}, headers=BOB
    )
    assert first.status_code == 200 and first.json()["queue"] == "managers"
    api_broker.add_history(req.id, HistoryEntry(at=utcnow(), event="delivered", channel="inbox"))
    again = client.post(
        f"/v1/requests/{req.id}/decision", json={"outcome": "escalated"}, headers=BOB
    )
    assert again.status_code == 200 and again.json()["queue"] == "managers"
    assert [h.event for h in api_broker.get_request(req.id).history].count("escalated") == 1


def test_a_repeat_with_another_reason_is_a_conflict(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    body = {"outcome": "rejected", "reason": "too much"}
    assert client.post(f"/v1/requests/{req.id}/decision", json=body, headers=BOB).status_code == 200
    other = client.post(
        f"/v1/requests/{req.id}/decision", json={**body, "reason": "wrong order"}, headers=BOB
    )
    assert other.status_code == 409 and other.json()["request"]["decision"]["reason"] == "too much"


def test_oversized_bodies_are_413_before_anything_reads_them(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    big = json.dumps({"outcome": "rejected", "reason": "x" * (2 << 20)})
    for path in (
        f"/v1/requests/{req.id}/decision",
        "/v1/slack/interactions",
        "/v1/webhooks/ops/replies",
    ):
        resp = client.post(path, content=big, headers={**BOB, "Content-Type": "application/json"})
        assert resp.status_code == 413 and resp.json()["error"] == "too_large"

    def chunks() -> Iterator[bytes]:
        for _ in range(3):
            yield b"x" * (1 << 19)

    streamed = client.post(f"/v1/requests/{req.id}/decision", content=chunks(), headers=BOB)
    assert streamed.status_code == 413
    assert api_broker.get_request(req.id).is_pending


def test_ids_that_are_not_ids_are_422(client: TestClient) -> None:
    for path in ("/v1/requests/a:b", "/v1/runs/run_1:pending", "/v1/requests/%20"):
        resp = client.get(path, headers=bearer(ADMIN))
        assert resp.status_code == 422, path
        assert set(resp.json()) >= {"error", "detail"}


def test_a_redis_error_that_is_not_an_outage_is_a_plain_500(cfg: Config, redis: Redis) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    broker.create_run("a", "p", run_id="run_x")
    redis.set(broker.keys.run_pending("run_x"), "not a set")
    with TestClient(
        create_app(Settings(admin_token=ADMIN), cfg, broker), raise_server_exceptions=False
    ) as c:
        resp = c.get("/v1/runs/run_x", headers=bearer(ADMIN))
    assert resp.status_code == 500 and resp.json() == {
        "error": "internal",
        "detail": "internal error",
    }
