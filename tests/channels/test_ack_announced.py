"""An ack ("I'm on it") is announced: `approval.acked` goes on the queue's stream, the Slack
message is updated in place to say who is on it, SSE listeners hear it, and neither webhooks
nor mail are told (an ack is no decision and no webhook event type)."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from api.testing import ServerThread
from broker.domain.events import parse_entry
from broker.domain.models import Decision
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.redis.replies import as_str
from channels.slack import action_ids as ids
from tests.support.fakes.harness import running
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.smtp import SmtpSink
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.notifier_setup import every_channel, make_broker, refund, settled
from tests.support.sse import events_of, next_event
from tests.support.waiting import wait_for

ALICE = {"Authorization": "Bearer tok-alice-fixups-ack-0123"}


@pytest.fixture
def broker(redis: Redis, receiver: WebhookReceiver, slack: FakeSlack, smtp: SmtpSink) -> Broker:
    channels = ["inbox", "webhook:ops", "slack:approvals", "email:leads"]
    queues = {
        "default": {"channels": channels, "escalate_to": "managers"},
        "managers": {"channels": ["inbox"]},
    }
    return make_broker(
        redis,
        every_channel(
            receiver,
            slack,
            smtp,
            queues=queues,
            approvers={
                "alice": {
                    "roles": ["ops"],
                    "token_sha256": hash_token(ALICE["Authorization"].removeprefix("Bearer ")),
                }
            },
        ),
    )


def stream_types(broker: Broker, request_id: str) -> list[str]:
    entries = broker.redis.xrange(broker.keys.stream("default"))
    return [as_str(f[b"type"]) for _, f in entries if as_str(f[b"request_id"]) == request_id]


def test_an_ack_updates_the_slack_message_in_place_and_tells_no_webhook_or_mail(
    broker: Broker, receiver: WebhookReceiver, slack: FakeSlack, smtp: SmtpSink
) -> None:
    with running(broker), TestClient(create_app(Settings(), broker.config, broker)) as client:
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
        assert slack.message_for(request.id) is not None
        mailed, updates = len(smtp.mails), len(slack.calls_to("chat.update"))
        assert "is on it" not in json.dumps(slack.message_for(request.id))

        resp = client.post(f"/v1/requests/{request.id}/ack", headers=ALICE)
        assert resp.status_code == 200, resp.text
        assert stream_types(broker, request.id) == ["approval.requested", "approval.acked"]
        wait_for(lambda: len(slack.calls_to("chat.update", ok_only=True)) > updates)
        wait_for(lambda: settled(broker))
        message = slack.message_for(request.id)
        assert message is not None
        assert ":eyes: `alice` is on it" in json.dumps(message["blocks"])
        actions = [
            e["action_id"]
            for b in message["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
        ]
        assert ids.APPROVE in actions  # still pending: still decidable
        assert len(slack.posts_for(request.id)) == 1  # updated, not posted again
        types = [h.payload["type"] for h in receiver.accepted("/ops")]
        assert types == ["approval.requested"]
        assert len(smtp.mails) == mailed
    assert broker.dead_letters() == []


def test_a_refused_ack_announces_nothing(broker: Broker) -> None:
    request = broker.create_request(refund())
    broker.decide(request.id, Decision(outcome="rejected", reason="no"), decided_by="alice")
    with TestClient(create_app(Settings(), broker.config, broker)) as client:
        resp = client.post(f"/v1/requests/{request.id}/ack", headers=ALICE)
    assert resp.status_code == 409
    assert stream_types(broker, request.id) == ["approval.requested", "approval.decided"]


def test_an_ack_is_streamed_over_sse(broker: Broker) -> None:
    app = create_app(Settings(), broker.config, broker)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        with http.stream("GET", "/v1/events", headers=ALICE) as resp:
            events = events_of(resp.iter_lines())
            assert next(events).comment == "connected"
            request = broker.create_request(refund())
            assert next_event(events).event == "approval.requested"
            acked = http.post(f"/v1/requests/{request.id}/ack", headers=ALICE)
            assert acked.status_code == 200
            event = next_event(events)
    assert event.event == "approval.acked"
    assert event.data["id"] == request.id and event.data["acked_by"] == "alice"
    assert event.data["status"] == "pending"


def test_an_acked_entry_is_a_known_event() -> None:
    fields = {"type": "approval.acked", "request_id": "req_1", "queue": "default"}
    assert parse_entry("t:stream:default", "default", "1-0", fields).type == "approval.acked"
