"""A request walks an escalation chain with every part real: the agent on an RQ worker, the
notifier delivering each step to its queue's webhook, the sweeper, the resumer. At the end of
the chain it times out and the run resumes once, with the model told no one answered."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from refunds_demo import Ledger

from broker.domain.config import parse_config
from broker.domain.models import Status
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.starting import start_run
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker, resume_once  # noqa: F401 - redis, broker, api_broker on both backends
from tests.support.fakes.harness import SECRET, running, webhook
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.jobs import jobs_bound_to, work
from tests.support.waiting import wait_for
from workers.sweeper import sweep_forever

QUEUES = ("default", "leads", "managers")


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver(SECRET).start()
    yield r
    r.stop()


@pytest.fixture
def chain(make_broker_on: Callable[..., Broker], receiver: WebhookReceiver) -> Iterator[Broker]:
    config = parse_config(
        {
            "queues": {
                "default": {
                    "channels": ["inbox", "webhook:a"],
                    "timeout_s": 0.5,
                    "escalate_to": "leads",
                },
                "leads": {"channels": ["webhook:b"], "timeout_s": 0.5, "escalate_to": "managers"},
                "managers": {"channels": ["webhook:c"], "timeout_s": 0.5},
            },
            "webhooks": {name: webhook(receiver.url(f"/{name}")) for name in "abc"},
        }
    )
    with jobs_bound_to(make_broker_on(config)) as broker:
        yield broker


def events_at(receiver: WebhookReceiver, path: str) -> list[tuple[str, str]]:
    return [
        (d.payload["type"], d.payload["data"]["queue"])
        for d in receiver.accepted(path)
        if d.verified
    ]


def test_two_escalations_then_a_time_out_reach_each_queues_channels_and_resume_once(
    chain: Broker, receiver: WebhookReceiver
):
    broker = chain
    register_agent(broker, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
    run = start_run(broker, "refunds", "Refund $120 on order A103 because the tent floor is torn.")
    work(broker)
    [request_id] = broker.get_run(run.id).pending

    stop = threading.Event()
    sweeper = threading.Thread(target=sweep_forever, args=(broker, stop), kwargs={"interval": 0.05})
    with running(broker):
        sweeper.start()
        try:
            done = wait_for(
                lambda: (r := broker.get_request(request_id)).status is Status.timed_out and r
            )
            wait_for(lambda: len(events_at(receiver, "/c")) == 2)
        finally:
            stop.set()
            sweeper.join()

    assert [(h.from_queue, h.to_queue) for h in done.history if h.event == "escalated"] == [
        ("default", "leads"),
        ("leads", "managers"),
    ]

    # each step reached the channels of the queue it happened in, and only those; in any order,
    # since an endpoint's deliveries run side by side (a busy machine can land the later first)
    def types_at(path: str) -> list[str]:
        return sorted(t for t, _ in events_at(receiver, path))

    assert types_at("/a") == ["approval.escalated", "approval.requested"]
    assert types_at("/b") == ["approval.escalated", "approval.escalated"]
    assert types_at("/c") == ["approval.escalated", "approval.timed_out"]

    handled = resume_once(broker, consumer="r1")
    assert [(h.run_id, h.round, h.action) for h in handled] == [(run.id, 1, "enqueued")]
    assert resume_once(broker, consumer="r2") == []
    work(broker)
    finished = broker.get_run(run.id)
    assert finished.status.value == "finished"
    assert finished.output["refunded"] is False
    assert "No one answered" in finished.output["message"]
    assert Ledger(broker.redis, broker.keys.prefix).all() == []
