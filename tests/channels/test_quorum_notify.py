"""A partial approval reaches the channels: Slack updates in place, webhooks hear
`approval.voted`, mail stays quiet (its links stay valid for the others)."""

from __future__ import annotations

import json

from redis import Redis

from broker.domain.events import parse_entry
from broker.domain.models import Decision
from channels.slack import action_ids as ids
from tests.support.fakes.harness import running
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.smtp import SmtpSink
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.notifier_setup import every_channel, make_broker, refund, settled
from tests.support.waiting import wait_for


def test_a_vote_updates_slack_in_place_and_is_sent_to_webhooks_not_mailed(
    redis: Redis, receiver: WebhookReceiver, slack: FakeSlack, smtp: SmtpSink
) -> None:
    channels = ["webhook:ops", "slack:approvals", "email:leads"]
    config = every_channel(
        receiver,
        slack,
        smtp,
        queues={"default": {"channels": channels, "quorum": 2}},
        approvers={"alice": {"roles": ["ops"]}, "bob": {"roles": ["ops"]}},
    )
    broker = make_broker(redis, config)
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
        mailed = len(smtp.mails)
        broker.decide(request.id, Decision(outcome="approved"), decided_by="alice")
        wait_for(lambda: settled(broker))
        message = slack.message_for(request.id)
        assert message is not None
        shown = json.dumps(message["blocks"])
        assert "1 of 2 approvals: `alice`" in shown
        buttons = [
            e["action_id"]
            for b in message["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
        ]
        assert ids.APPROVE in buttons  # kept for the others
        accessories = [b["accessory"]["action_id"] for b in message["blocks"] if "accessory" in b]
        assert accessories == [ids.ACK]
        assert len(slack.posts_for(request.id)) == 1  # updated, not posted again
        types = [h.payload["type"] for h in receiver.accepted("/ops")]
        assert types == ["approval.requested", "approval.voted"]
        voted = receiver.accepted("/ops")[-1].payload["data"]
        assert voted["status"] == "pending" and [v["by"] for v in voted["approvals"]] == ["alice"]
        assert len(smtp.mails) == mailed  # nothing new mailed
        broker.decide(request.id, Decision(outcome="approved"), decided_by="bob")
        wait_for(lambda: settled(broker))
        wait_for(lambda: "Approved" in json.dumps(slack.message_for(request.id)["blocks"]))
    assert broker.dead_letters() == []


def test_a_voted_entry_is_a_known_event() -> None:
    fields = {"type": "approval.voted", "request_id": "req_1", "queue": "default"}
    event = parse_entry("t:stream:default", "default", "1-0", fields)
    assert event.type == "approval.voted"
