"""The API enqueues the resume of a round it completes itself; the outbox is the recovery path.

A decision on the judge's async face (the webhook reply route, the REST decide route) that
answers a round's last call claims the round in its step and leaves the outbox entry in
`resumes_direct`; the API enqueues the resume job with RQ's unique enqueue and deletes the entry
before it answers. An API that dies between its step and its enqueue leaves the entry: the
resumer takes it once it is `grace_s` old, and the round is resumed exactly once, however the
API and the resumer cross.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from rq.job import Job
from standardwebhooks.webhooks import Webhook

from api.app import create_app
from broker.domain.config import Config
from broker.domain.models import NewRequest
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.direct_resume import DirectResumes
from broker.runs.outbox import Resumer
from broker.runs.starting import resume_job_id, run_queue
from broker.store.decide_step import Resume
from tests.support.resumes import resumes_of

SECRET = "whsec_" + base64.b64encode(b"direct-resume-secret-0123456789ab").decode()
API_CONFIG = {
    "queues": {"default": {"channels": ["webhook:ops"]}},
    "webhooks": {"ops": {"url": "http://127.0.0.1:9/ops", "secret": SECRET, "roles": ["ops"]}},
}


class DiedAfterItsStep(DirectResumes):
    """An API process killed right after its decide step: the step is in Redis (round claimed,
    entry written), and nothing after it ran: no job, the entry not deleted."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.left: list[Resume] = []

    async def resume(self, resume: Resume) -> None:
        self.left.append(resume)


@pytest.fixture
def client(api_broker: Broker, cfg: Config) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(), cfg, api_broker)) as c:
        yield c


def waiting_run(broker: Broker, name: str) -> tuple[str, str]:
    """A run waiting on one request in round 1: (run id, request id)."""
    run = broker.create_run("agent", "go", run_id=name)
    (req,) = broker.create_round(run.id, 1, [NewRequest(tool_name="refund", args={"x": 1})])
    return run.id, req.id


def reply(client: TestClient, request_id: str, msg_id: str) -> dict[str, object]:
    body = json.dumps({"request_id": request_id, "outcome": "approved"}).encode()
    now = datetime.now(UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, body.decode()),
        "content-type": "application/json",
    }
    resp = client.post("/v1/webhooks/ops/replies", content=body, headers=headers)
    assert resp.status_code == 200, resp.text
    answer: dict[str, object] = resp.json()
    return answer


def resume_job(broker: Broker, run_id: str) -> bool:
    return Job.exists(resume_job_id(run_id, 1), connection=broker.store.rq_redis)


def outboxes(broker: Broker) -> tuple[int, int]:
    keys = broker.keys.part(0)
    return int(broker.redis.xlen(keys.resumes)), int(broker.redis.xlen(keys.resumes_direct))


def test_a_webhook_reply_that_completes_a_round_has_its_resume_enqueued_before_the_answer(
    client: TestClient, api_broker: Broker
) -> None:
    run_id, request_id = waiting_run(api_broker, "run_direct")
    answer = reply(client, request_id, "msg_direct")
    assert answer["status"] == "approved"
    assert answer == api_broker.get_request(request_id).public()  # the request, as GET has it
    # no resumer ran: the API enqueued the job itself, claimed as the resumer's, entry gone
    assert resume_job(api_broker, run_id)
    assert run_queue(api_broker).job_ids == [resume_job_id(run_id, 1)]
    assert outboxes(api_broker) == (0, 0)
    assert api_broker.redis.hget(api_broker.keys.run(run_id), "claimed:1") == b"resumer"
    assert Resumer(api_broker, block_ms=None).run_once() == []


def test_an_api_killed_between_its_step_and_its_enqueue_is_resumed_once_by_the_resumer(
    client: TestClient, api_broker: Broker
) -> None:
    dead = DiedAfterItsStep(api_broker)
    client.app.state.api.judge.resumes = dead  # type: ignore[attr-defined]
    run_id, request_id = waiting_run(api_broker, "run_killed")
    assert reply(client, request_id, "msg_killed")["status"] == "approved"
    (left,) = dead.left
    assert not resume_job(api_broker, run_id)
    assert outboxes(api_broker) == (0, 1)  # the step's entry, where the resumers look later

    # the resumer reads the entry at once but leaves it: the API may still be enqueueing it
    resumer = Resumer(api_broker, block_ms=None, direct=True, grace_s=0.3)
    assert resumer.run_once() == []
    assert not resume_job(api_broker, run_id)
    # once it is grace_s old, the resumer takes it (run_forever reads it every DIRECT_POLL_S)
    handled = []
    for _ in range(100):
        handled = resumer.run_once()
        if handled:
            break
        threading.Event().wait(0.05)
    assert [(h.run_id, h.round, h.action) for h in handled] == [(run_id, 1, "enqueued")]
    assert resume_job(api_broker, run_id)
    assert outboxes(api_broker) == (0, 0)
    # the API's enqueue, had it come after all, makes no second job
    assert DirectResumes(api_broker).enqueue([left]) == [False]
    assert resumes_of(api_broker, run_id) == 1
    assert run_queue(api_broker).job_ids == [resume_job_id(run_id, 1)]


def race(api: DirectResumes, resumer: Resumer, left: Resume) -> list[bool]:
    """The API's enqueue of `left` and the resumer's read of it, released together: whether
    each made a job."""
    barrier = threading.Barrier(2)
    made: list[bool] = []

    def as_api() -> None:
        barrier.wait()
        made.extend(api.enqueue([left]))

    def as_resumer() -> None:
        barrier.wait()
        made.extend(h.action == "enqueued" for h in resumer.run_once())

    threads = [threading.Thread(target=as_api), threading.Thread(target=as_resumer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return made


def test_an_api_and_a_resumer_taking_the_same_entry_at_once_make_one_job(
    client: TestClient, api_broker: Broker
) -> None:
    dead = DiedAfterItsStep(api_broker)
    client.app.state.api.judge.resumes = dead  # type: ignore[attr-defined]
    for i in range(20):
        run_id, request_id = waiting_run(api_broker, f"run_race{i}")
        reply(client, request_id, f"msg_race{i}")
        (left,) = dead.left
        dead.left.clear()
        resumer = Resumer(api_broker, block_ms=None, direct=True, grace_s=0.0)
        made = race(DirectResumes(api_broker), resumer, left)
        assert made.count(True) == 1, made
        assert resumes_of(api_broker, run_id) == 1
        assert outboxes(api_broker) == (0, 0)
    assert len(run_queue(api_broker).job_ids) == 20
