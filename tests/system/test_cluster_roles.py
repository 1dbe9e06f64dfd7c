"""The roles on a Redis Cluster (issue 19): the API, a notifier and the resumer, each on the
cluster for the broker's keys, RQ on its own single Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from redis.cluster import RedisCluster
from rq import Queue
from rq.serializers import JSONSerializer
from typer.testing import CliRunner

from api.app import create_app
from approval_broker.cli import app
from approval_broker.cli_ops import fleet_status
from broker.domain.config import parse_config
from broker.domain.models import Decision, NewRequest, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.outbox import Resumer
from broker.runs.starting import RUN_QUEUE, resume_job_id
from notifiers.runner import start_notifier
from tests.support.auth import person
from tests.support.fakes.harness import options
from tests.support.fakes.slack import FakeSlack
from tests.support.waiting import wait_for

ADMIN = "tok-admin-of-the-cluster-tests-01"
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}


@pytest.fixture
def rq_redis(redis_url: str) -> Iterator[Redis]:
    client = Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


def test_a_round_answered_on_the_cluster_is_resumed_once_on_rqs_redis(
    cluster_client: RedisCluster, rq_redis: Redis, config
):
    broker = Broker(cluster_client, config, prefix="t:")
    broker.store.rq = rq_redis
    runs = [f"run-c{i}" for i in range(6)]  # over several partitions
    for run_id in runs:
        broker.create_run("refunds", "go", run_id=run_id)
        for r in broker.create_round(run_id, 1, [NewRequest(tool_name="refund")]):
            broker.decide(r.id, Decision(outcome="approved"), decided_by="ann")
    assert len({broker.keys.partition_of_run(r) for r in runs}) > 1
    each = Resumer(broker, block_ms=None).per_partition()
    handled = [h for r in each for h in r.run_once()]
    assert sorted((h.run_id, h.action) for h in handled) == [(r, "enqueued") for r in runs]
    queue = Queue(RUN_QUEUE, connection=rq_redis, serializer=JSONSerializer)
    assert sorted(queue.job_ids) == sorted(resume_job_id(r, 1) for r in runs)
    assert all(cluster_client.xlen(broker.keys.of_run(r).resumes) == 0 for r in runs)
    assert [h for r in each for h in r.run_once()] == []  # acknowledged: nothing again


def test_a_notifier_on_the_cluster_delivers_requests_of_every_partition(
    cluster_client: RedisCluster,
):
    slack = FakeSlack()
    slack.start()
    try:
        config = parse_config(
            {
                "queues": {"default": {"channels": ["slack:approvals"]}},
                "slack": {
                    "bot_token": slack.token,
                    "signing_secret": "s",
                    "api_base_url": slack.url,
                    "channels": {"approvals": {"channel": "C1"}},
                },
            }
        )
        broker = Broker(cluster_client, config, prefix="t:")
        notifier = start_notifier(broker, options())
        try:
            made = broker.create_requests([NewRequest(tool_name="pay") for _ in range(8)])
            assert len({broker.keys.partition_of_request(r.id) for r in made}) > 1
            for r in made:
                wait_for(lambda r=r: slack.posts_for(r.id))
        finally:
            notifier.stop()
    finally:
        slack.stop()


def test_a_decision_over_http_on_the_cluster(cluster_client: RedisCluster):
    config = parse_config(
        {
            "queues": {"default": {"channels": ["inbox"], "timeout_s": 600}},
            "approvers": {
                "alice": person("tok-alice", ["requester"]),
                "bob": person("tok-bob", ["finance"]),
            },
        }
    )
    broker = Broker(cluster_client, config, prefix="t:")
    with TestClient(create_app(Settings(admin_token=ADMIN), config, broker)) as client:
        made = client.post("/v1/requests", json={"tool_name": "refund"}, headers=ALICE)
        assert made.status_code == 201, made.text
        rid = made.json()["id"]
        listed = client.get("/v1/requests", headers=ALICE)
        assert listed.status_code == 200 and rid in [r["id"] for r in listed.json()]
        decided = client.post(
            f"/v1/requests/{rid}/decision", json={"outcome": "approved"}, headers=BOB
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["status"] == "approved"
    assert broker.get_request(rid).status is Status.approved


def test_the_cli_on_a_cluster_lists_what_the_cluster_holds(
    cluster_client: RedisCluster,
    redis_cluster,
    redis_url: str,
    tmp_config,
    monkeypatch: pytest.MonkeyPatch,
):
    path = tmp_config("[queues.default]\n")
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_CLUSTER", "1")
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_URL", redis_cluster.url)
    monkeypatch.setenv("APPROVAL_BROKER_CONFIG", str(path))
    monkeypatch.setenv("APPROVAL_BROKER_KEY_PREFIX", "t:")
    monkeypatch.delenv("APPROVAL_BROKER_RQ_REDIS_URL", raising=False)
    refused = CliRunner().invoke(app, ["pending", "--json"])
    assert refused.exit_code != 0 and "APPROVAL_BROKER_RQ_REDIS_URL" in refused.output
    monkeypatch.setenv("APPROVAL_BROKER_RQ_REDIS_URL", redis_url)
    broker = Broker.from_settings(Settings(), parse_config({"queues": {"default": {}}}))
    assert isinstance(broker.redis, RedisCluster) and broker.keys.partitions == 16
    made = broker.create_requests([NewRequest(tool_name="refund") for _ in range(20)])
    out = CliRunner().invoke(app, ["pending", "--json"])
    assert out.exit_code == 0, out.output
    assert {json.loads(line)["id"] for line in out.stdout.splitlines()} == {r.id for r in made}


def test_queue_depths_on_a_cluster_count_every_partition(cluster_client: RedisCluster):
    config = parse_config({"queues": {"default": {"channels": ["inbox"]}, "other": {}}})
    broker = Broker(cluster_client, config, prefix="t:")
    made = broker.create_requests([NewRequest(tool_name="refund") for _ in range(20)])
    assert len({broker.keys.partition_of_request(r.id) for r in made}) > 1
    with TestClient(create_app(Settings(admin_token=ADMIN), config, broker)) as client:
        listed = client.get("/v1/queues", headers={"Authorization": f"Bearer {ADMIN}"})
    assert {q["name"]: q["pending"] for q in listed.json()} == {"default": 20, "other": 0}
    assert fleet_status(broker)["queues"] == {"default": 20, "other": 0}
