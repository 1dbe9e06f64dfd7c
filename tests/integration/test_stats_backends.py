"""Insights on both backends: on a Redis Cluster each partition keeps its own rollups (in its
slot, beside its requests) and `/v1/stats` sums them; on a single Redis the same figures. A
route rule applies on both (on the cluster its hit is counted in the rules' slot)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, NewRequest, Outcome, Status
from broker.domain.rules.models import parse_body
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import bearer
from tests.support.backends import on_backend, on_backend_make_broker  # noqa: F401

ADMIN = "tok-admin-stats-backends-0123456789"


def config() -> Config:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox"], "timeout_s": 600},
                "finance": {"channels": ["inbox"], "timeout_s": 600},
            }
        }
    )


def test_stats_sum_every_partitions_rollups(make_broker_on: Callable[..., Broker]) -> None:
    broker = make_broker_on(config())
    broker.requests.rules.create(
        parse_body({"id": "big", "effect": "route", "tool": "refund",
                    "args": {"amount": {"gt": 500}}, "route": {"queue": "finance", "risk": "high"}}),
        created_by="pat",
    )  # fmt: skip
    made = [
        broker.create_request(NewRequest(tool_name="refund", args={"amount": a}))
        for a in (10, 20, 30, 900, 950)
    ]
    runs = [broker.create_run("bench", "go", run_id=f"run_s{i}") for i in range(6)]
    for run in runs:  # requests of runs: spread over the partitions by run
        made += broker.create_round(run.id, 1, [NewRequest(tool_name="ship")])
    partitions = {broker.keys.partition_of_request(r.id) for r in made}
    assert len(partitions) == (1 if broker.partitions == 1 else len(partitions)) >= 1
    routed = [r for r in made if r.queue == "finance"]
    assert len(routed) == 2 and all(r.risk == "high" for r in routed)
    for r in made[:3] + made[5:8]:
        broker.decide(r.id, Decision(outcome=Outcome.approved), decided_by="alice")
    broker.decide(made[8].id, Decision(outcome=Outcome.rejected, reason="no"), decided_by="bob")
    later = datetime.now(UTC) + timedelta(seconds=700)
    timed = broker.sweep(now=later.timestamp())
    assert len(timed) == 11 - 7  # the rest time out
    assert all(broker.get_request(r.request_id).status is Status.timed_out for r in timed)
    with TestClient(create_app(Settings(admin_token=ADMIN), broker.config, broker)) as api:
        ahead = {"until": (later + timedelta(hours=1)).isoformat()}  # past the simulated sweep
        body = api.get("/v1/stats", params=ahead, headers=bearer(ADMIN)).json()
    assert body["requests"]["total"] == 11
    assert body["requests"]["by_queue"] == {"default": 9, "finance": 2}
    assert body["requests"]["by_tool"] == {"ship": 6, "refund": 5}
    assert body["requests"]["by_outcome"] == {"approved": 6, "timed_out": 4, "rejected": 1}
    assert body["decided_by"] == {"person": 7, "rule": 0, "timeout": 4}
    assert body["rule_hits"] == {"big": 2} and body["by_approver"] == {"alice": 6, "bob": 1}
    assert broker.requests.rules.get("big").hits == 2
