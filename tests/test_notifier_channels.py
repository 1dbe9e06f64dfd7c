"""Integration tests of the notifier fleet against a real Redis and local fakes of Slack,
SMTP (aiosmtpd) and webhook receivers (verifying with the standardwebhooks package)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.client import Broker
from broker.config import parse_config
from broker.keys import NOTIFIER_GROUP
from broker.links import read_link
from broker.models import Decision, NewRequest, Outcome
from tests.conftest import wait_for
from tests.fakes.harness import OLD_SECRET, SECRET, WRONG_SECRET, running, webhook
from tests.fakes.slack import FakeSlack
from tests.fakes.smtp import SmtpSink
from tests.fakes.webhook_receiver import WebhookReceiver

PUBLIC = "https://approvals.example.com"


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver(SECRET).start()
    yield server
    server.stop()


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    server = FakeSlack().start()
    yield server
    server.stop()


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    server = SmtpSink().start()
    yield server
    server.stop()


def slack_section(fake: FakeSlack) -> dict[str, Any]:
    return {
        "bot_token": fake.token,
        "signing_secret": "signing",
        "api_base_url": fake.url,
        "channels": {"approvals": {"channel": "C1"}, "managers": {"channel": "C2"}},
    }


def email_section(sink: SmtpSink, **extra: Any) -> dict[str, Any]:
    return {
        "smtp_url": sink.url,
        "from": "approvals@example.com",
        "public_url": PUBLIC,
        "lists": {"leads": {"to": ["lead@example.com", "cfo@example.com"]}},
        **extra,
    }


def make_broker(redis: Redis, raw: dict[str, Any]) -> Broker:
    return Broker(redis, parse_config(raw), prefix="t:")


def settled(broker: Broker, queue: str = "default") -> bool:
    """Every entry of the queue's stream was read by the group and acknowledged."""
    stream = broker.keys.stream(queue)
    last = broker.redis.xrevrange(stream, count=1)
    if not last:
        return False
    for group in broker.redis.xinfo_groups(stream):
        if group["name"] in (NOTIFIER_GROUP, NOTIFIER_GROUP.encode()):
            return group["pending"] == 0 and group["last-delivered-id"] == last[0][0]
    return False


def pending(broker: Broker, queue: str = "default") -> int:
    return int(broker.redis.xpending(broker.keys.stream(queue), NOTIFIER_GROUP)["pending"])


def stat(broker: Broker, name: str) -> int:
    return int(broker.redis.hget(broker.keys.stats, name) or 0)


def delivered_channels(broker: Broker, request_id: str) -> list[str]:
    request = broker.get_request(request_id)
    return sorted(h.channel or "" for h in request.history if h.event == "delivered")


def refund(**extra: Any) -> NewRequest:
    return NewRequest(tool_name="refund", args={"order_id": "A1", "amount": 120}, **extra)


# ---- fan-out ----------------------------------------------------------------------------


def test_one_request_fans_out_to_every_channel(
    redis: Redis, receiver: WebhookReceiver, slack: FakeSlack, smtp: SmtpSink
) -> None:
    broker = make_broker(
        redis,
        {
            "queues": {
                "default": {"channels": ["inbox", "webhook:ops", "slack:approvals", "email:leads"]}
            },
            "webhooks": {"ops": webhook(receiver.url("/ops"))},
            "slack": slack_section(slack),
            "email": email_section(smtp),
        },
    )
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    (hook,) = receiver.accepted("/ops")
    assert hook.payload["type"] == "approval.requested"
    assert hook.payload["data"]["id"] == request.id
    (post,) = slack.posts_for(request.id)
    assert post["channel"] == "C1"
    assert sorted(r for m in smtp.mails for r in m.rcpt_tos) == [
        "cfo@example.com",
        "lead@example.com",
    ]
    assert delivered_channels(broker, request.id) == [
        "email:leads",
        "slack:approvals",
        "webhook:ops",
    ]
    assert [stat(broker, f"delivered:{k}") for k in ("webhook", "slack", "email")] == [1, 1, 1]
    assert broker.dead_letters() == []


# ---- Slack ------------------------------------------------------------------------------


def slack_broker(redis: Redis, slack: FakeSlack, **queues: Any) -> Broker:
    return make_broker(
        redis,
        {
            "queues": queues
            or {
                "default": {"channels": ["slack:approvals"], "escalate_to": "managers"},
                "managers": {"channels": ["slack:managers"]},
            },
            "slack": slack_section(slack),
            "approvers": {"alice": {"roles": ["finance"], "slack_user_id": "U0ALICE"}},
        },
    )


def buttons(message: dict[str, Any]) -> list[str]:
    return [
        e["action_id"] for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]
    ]


def test_slack_message_is_updated_in_place_when_decided(redis: Redis, slack: FakeSlack) -> None:
    broker = slack_broker(redis, slack)
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: slack.posts_for(request.id))
        assert buttons(slack.message_for(request.id) or {}) == ["approve", "reject", "escalate"]
        broker.decide(
            request.id, Decision(outcome=Outcome.rejected, reason="too much"), decided_by="alice"
        )
        wait_for(lambda: slack.calls_to("chat.update", ok_only=True))
        wait_for(lambda: settled(broker))
    (post,) = slack.posts_for(request.id)
    (update,) = slack.calls_to("chat.update", ok_only=True)
    assert update.params["ts"] and update.params["channel"] == "C1"
    message = slack.message_for(request.id) or {}
    assert message["ts"] == update.params["ts"]
    shown = json.dumps(message["blocks"])
    assert "Rejected" in shown and "<@U0ALICE>" in shown and "too much" in shown
    assert buttons(message) == []


def test_escalation_updates_the_old_message_and_posts_in_the_new_queue(
    redis: Redis, slack: FakeSlack
) -> None:
    broker = slack_broker(redis, slack)
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: slack.posts_for(request.id))
        broker.escalate(request.id, reason="over my limit", by="alice")
        wait_for(lambda: len(slack.posts_for(request.id)) == 2)
        wait_for(lambda: settled(broker, "default") and settled(broker, "managers"))
        broker.decide(request.id, Decision(outcome=Outcome.approved), decided_by="bob")
        wait_for(lambda: settled(broker, "managers"))
    old, new = slack.posts_for(request.id)
    assert (old["channel"], new["channel"]) == ("C1", "C2")
    first = slack.messages[("C1", old["ts"])]
    assert buttons(first) == [] and "Escalated to `managers`" in json.dumps(first["blocks"])
    second = slack.messages[("C2", slack.calls_to("chat.update")[-1].params["ts"])]
    assert buttons(second) == [] and "Approved" in json.dumps(second["blocks"])


def test_slack_429_is_retried_after_retry_after(redis: Redis, slack: FakeSlack) -> None:
    broker = slack_broker(redis, slack)
    slack.fail("chat.postMessage", 429, error="ratelimited", retry_after=1)
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: slack.posts_for(request.id))
        wait_for(lambda: settled(broker))
    limited, ok = slack.calls_to("chat.postMessage")
    assert (limited.status, ok.status) == (429, 200)
    assert ok.at - limited.at >= 1.0
    assert len(slack.posts_for(request.id)) == 1
    assert stat(broker, "failed:slack") == 1 and stat(broker, "delivered:slack") == 1


def test_slack_500_then_success_posts_once(redis: Redis, slack: FakeSlack) -> None:
    broker = slack_broker(redis, slack)
    slack.fail("chat.postMessage", 500)
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    assert [c.status for c in slack.calls_to("chat.postMessage")] == [500, 200]
    assert len(slack.posts_for(request.id)) == 1
    assert delivered_channels(broker, request.id) == ["slack:approvals"]
    assert broker.dead_letters() == []


def test_a_permanent_slack_error_is_dead_lettered(redis: Redis, slack: FakeSlack) -> None:
    broker = slack_broker(redis, slack)
    slack.fail("chat.postMessage", 200, error="channel_not_found")
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    ((_, letter),) = broker.dead_letters()
    assert letter["source"] == "slack:approvals" and "channel_not_found" in letter["error"]
    assert letter["f.request_id"] == request.id
    assert len(slack.calls_to("chat.postMessage")) == 1  # not retried


def test_a_redelivered_event_updates_rather_than_posts_again(
    redis: Redis, slack: FakeSlack
) -> None:
    broker = slack_broker(redis, slack)
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
        redis.xadd(
            broker.keys.stream("default"),
            {"type": "approval.requested", "request_id": request.id, "queue": "default"},
        )
        wait_for(lambda: slack.calls_to("chat.update", ok_only=True))
        wait_for(lambda: settled(broker))
    assert len(slack.posts_for(request.id)) == 1


def test_racing_events_of_one_request_post_one_message(redis: Redis, slack: FakeSlack) -> None:
    """Requested and decided handled at once by two notifiers: one post, final state shown."""
    broker = slack_broker(redis, slack)
    slack.delay["chat.postMessage"] = 0.3
    requests = [broker.create_request(refund()) for _ in range(4)]
    for r in requests:
        broker.decide(r.id, Decision(outcome=Outcome.approved), decided_by="alice")
    with running(broker, batch=1, name="n1"), running(broker, batch=1, name="n2"):
        wait_for(lambda: settled(broker))
    for r in requests:
        assert len(slack.posts_for(r.id)) == 1
        message = slack.message_for(r.id) or {}
        assert buttons(message) == [] and "Approved" in json.dumps(message["blocks"])


def test_question_options_become_buttons(redis: Redis, slack: FakeSlack) -> None:
    broker = slack_broker(redis, slack)
    with running(broker):
        request = broker.create_request(
            NewRequest(tool_name="ask", kind="question", metadata={"options": ["red", "blue"]})
        )
        wait_for(lambda: settled(broker))
    assert buttons(slack.message_for(request.id) or {}) == [
        "answer:red",
        "answer:blue",
        "reject",
        "escalate",
    ]


# ---- email ------------------------------------------------------------------------------


def email_broker(redis: Redis, smtp: SmtpSink, **extra: Any) -> Broker:
    return make_broker(
        redis,
        {
            "queues": {"default": {"channels": ["email:leads"]}},
            "email": email_section(smtp, **extra),
        },
    )


def tokens_in(text: str) -> list[str]:
    return re.findall(re.escape(PUBLIC) + r"/v1/email/([A-Za-z0-9_.\-]+)", text)


def test_email_sends_one_mail_per_recipient_with_links_bound_to_them(
    redis: Redis, smtp: SmtpSink
) -> None:
    broker = email_broker(redis, smtp)
    with running(broker):
        request = broker.create_request(refund(prompt="Refund order A1?"))
        wait_for(lambda: settled(broker))
    assert len(smtp.mails) == 2
    nonces = set()
    for mail in smtp.mails:
        (recipient,) = mail.rcpt_tos
        assert mail.message["To"] == recipient
        assert "Refund order A1?" in mail.message["Subject"]
        plain, html = mail.part("plain"), mail.part("html")
        tokens = tokens_in(plain)
        assert sorted(tokens) == sorted(tokens_in(html))
        claims = [read_link(broker, t, 3600) for t in tokens]
        assert sorted(c.action for c in claims) == ["approve", "reject"]
        assert {c.recipient for c in claims} == {recipient}
        assert {c.request_id for c in claims} == {request.id}
        nonces |= {c.nonce for c in claims}
    assert len(nonces) == 2  # one per mail: using one mail's links does not spend the other's
    assert delivered_channels(broker, request.id) == ["email:leads"]


def test_email_logs_in_when_configured(redis: Redis) -> None:
    sink = SmtpSink(username="bot", password="s3cret").start()
    try:
        broker = email_broker(redis, sink, username="bot", password="s3cret")
        with running(broker):
            broker.create_request(refund())
            wait_for(lambda: settled(broker))
        assert len(sink.mails) == 2 and sink.logins
    finally:
        sink.stop()


def test_a_refused_recipient_is_dead_lettered_and_the_others_get_mail(
    redis: Redis, smtp: SmtpSink
) -> None:
    smtp.refuse.add("cfo@example.com")
    broker = email_broker(redis, smtp)
    with running(broker):
        broker.create_request(refund())
        wait_for(lambda: settled(broker))
    assert [m.rcpt_tos for m in smtp.mails] == [["lead@example.com"]]
    ((_, letter),) = broker.dead_letters()
    assert letter["source"] == "email:leads" and "cfo@example.com" in letter["error"]


def test_question_mail_links_answer_and_reject(redis: Redis, smtp: SmtpSink) -> None:
    broker = email_broker(redis, smtp)
    with running(broker):
        broker.create_request(NewRequest(tool_name="ask", kind="question", prompt="Which?"))
        wait_for(lambda: settled(broker))
    actions = {read_link(broker, t, 3600).action for t in tokens_in(smtp.mails[0].part("plain"))}
    assert actions == {"answer", "reject"}


# ---- webhooks ---------------------------------------------------------------------------


def hook_broker(redis: Redis, hooks: dict[str, dict[str, Any]], channels: list[str]) -> Broker:
    return make_broker(redis, {"queues": {"default": {"channels": channels}}, "webhooks": hooks})


def test_webhook_is_signed_and_verified_and_a_wrong_secret_is_refused(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    stranger = WebhookReceiver(WRONG_SECRET).start()
    try:
        broker = hook_broker(
            redis,
            {"ops": webhook(receiver.url("/ops")), "other": webhook(stranger.url("/x"))},
            ["webhook:ops", "webhook:other"],
        )
        with running(broker):
            request = broker.create_request(refund())
            wait_for(lambda: settled(broker))
        (good,) = receiver.to("/ops")
        assert good.verified and good.status == 204
        assert good.payload["data"]["id"] == request.id
        assert good.id.startswith("msg_") and good.headers["webhook-timestamp"].isdigit()
        refused = stranger.to("/x")
        assert len(refused) == 3 and not any(d.verified for d in refused)
        assert {d.status for d in refused} == {401}
        ((_, letter),) = broker.dead_letters()
        assert letter["source"] == "webhook:other" and "HTTP 401" in letter["error"]
    finally:
        stranger.stop()


def test_rotation_sends_a_signature_per_secret(redis: Redis) -> None:
    still_old = WebhookReceiver(OLD_SECRET).start()
    try:
        broker = hook_broker(
            redis, {"ops": webhook(still_old.url("/ops"), [SECRET, OLD_SECRET])}, ["webhook:ops"]
        )
        with running(broker):
            broker.create_request(refund())
            wait_for(lambda: settled(broker))
        (delivery,) = still_old.accepted("/ops")
        assert len(delivery.headers["webhook-signature"].split(" ")) == 2
    finally:
        still_old.stop()


def test_webhook_failing_twice_then_succeeding_keeps_its_id_and_honours_retry_after(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    receiver.plan("/flaky", [(429, {"Retry-After": "1"}), 500])
    broker = hook_broker(redis, {"flaky": webhook(receiver.url("/flaky"))}, ["webhook:flaky"])
    with running(broker):
        broker.create_request(refund())
        wait_for(lambda: settled(broker))
    tries = receiver.to("/flaky")
    assert [d.status for d in tries] == [429, 500, 204]
    assert len({d.id for d in tries}) == 1
    assert len({d.body for d in tries}) == 1
    assert tries[1].at - tries[0].at >= 1.0
    assert stat(broker, "failed:webhook") == 2 and stat(broker, "delivered:webhook") == 1
    assert broker.dead_letters() == []


def test_webhook_that_always_fails_is_dead_lettered_then_redriven_to_it_alone(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    receiver.default("/down", 503)
    broker = hook_broker(
        redis,
        {"up": webhook(receiver.url("/up")), "down": webhook(receiver.url("/down"))},
        ["webhook:up", "webhook:down"],
    )
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
        assert [d.status for d in receiver.to("/down")] == [503, 503, 503]
        ((letter_id, letter),) = broker.dead_letters()
        assert letter["source"] == "webhook:down"
        assert "gave up after 3 attempts" in letter["error"] and "HTTP 503" in letter["error"]
        assert letter["f.request_id"] == request.id and letter["channel"] == "webhook:down"
        history = broker.get_request(request.id).history
        assert [h.channel for h in history if h.event == "delivery_failed"] == ["webhook:down"]

        receiver.default("/down", 204)
        broker.redrive(letter_id)
        wait_for(lambda: receiver.accepted("/down"))
        wait_for(lambda: settled(broker))
    assert len({d.id for d in receiver.to("/down")}) == 1  # same webhook-id after the redrive
    assert len(receiver.to("/up")) == 1  # the channel that had it is not sent it again
    assert broker.dead_letters() == []


def test_410_disables_the_endpoint(redis: Redis, receiver: WebhookReceiver) -> None:
    receiver.default("/gone", 410)
    broker = hook_broker(redis, {"gone": webhook(receiver.url("/gone"))}, ["webhook:gone"])
    with running(broker):
        broker.create_request(refund())
        wait_for(lambda: settled(broker))
        assert len(receiver.to("/gone")) == 1  # not retried
        assert redis.hget(broker.keys.disabled, "webhook:gone")
        broker.create_request(refund())
        wait_for(lambda: len(broker.dead_letters()) == 2)
        wait_for(lambda: settled(broker))
    assert len(receiver.to("/gone")) == 1  # the second request never called it
    first, second = (fields["error"] for _, fields in broker.dead_letters())
    assert "410" in first and "disabled" in second


def test_callback_webhook_gets_the_outcome(redis: Redis, receiver: WebhookReceiver) -> None:
    broker = hook_broker(redis, {"cb": webhook(receiver.url("/cb"))}, ["inbox"])
    with running(broker):
        decided = broker.create_request(refund(callback="cb"))
        broker.decide(decided.id, Decision(outcome=Outcome.approved), decided_by="alice")
        timed_out = broker.create_request(refund(callback="cb", timeout_s=0.01))
        wait_for(lambda: broker.sweep())
        wait_for(lambda: len(receiver.accepted("/cb")) == 2)
        wait_for(lambda: settled(broker))
    got = {(d.payload["type"], d.payload["data"]["id"]) for d in receiver.accepted("/cb")}
    assert got == {("approval.decided", decided.id), ("approval.timed_out", timed_out.id)}


# ---- the loop ---------------------------------------------------------------------------


def test_a_hung_channel_does_not_hold_up_the_others(
    redis: Redis, receiver: WebhookReceiver, slack: FakeSlack
) -> None:
    broker = make_broker(
        redis,
        {
            "queues": {"default": {"channels": ["slack:approvals", "webhook:ops"]}},
            "webhooks": {"ops": webhook(receiver.url("/ops"))},
            "slack": slack_section(slack),
        },
    )
    slack.hold()
    with running(broker):
        requests = [broker.create_request(refund()) for _ in range(6)]
        wait_for(lambda: len(receiver.accepted("/ops")) == 6)
        assert not slack.calls_to("chat.postMessage")
        assert pending(broker) == 6  # not acknowledged while Slack lacks them
        slack.release()
        wait_for(lambda: settled(broker))
    assert all(len(slack.posts_for(r.id)) == 1 for r in requests)


def test_malformed_entries_are_dead_lettered_and_the_loop_goes_on(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    stream = broker.keys.stream("default")
    redis.xadd(stream, {"hello": "world"})
    redis.xadd(stream, {"type": "approval.requested", "request_id": "req_missing"})
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    assert [d.payload["data"]["id"] for d in receiver.accepted()] == [request.id]
    errors = sorted(fields["error"] for _, fields in broker.dead_letters())
    assert "req_missing" in errors[0] and "unknown event type" in errors[1]
    assert stat(broker, "failed:entry") == 2


def test_entries_left_by_a_dead_consumer_are_reclaimed(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    stream = broker.keys.stream("default")
    broker.ensure_group(stream, NOTIFIER_GROUP)
    request = broker.create_request(refund())
    gone = broker.create_request(refund())
    assert redis.xreadgroup(NOTIFIER_GROUP, "ghost", {stream: ">"})  # read, then "crashed"
    gone_entry = [eid for eid, f in redis.xrange(stream) if f[b"request_id"] == gone.id.encode()]
    redis.xdel(stream, *gone_entry)  # one of its entries was trimmed meanwhile
    with running(broker, claim_idle_s=0.3):
        wait_for(lambda: receiver.accepted("/ops"))
        wait_for(lambda: pending(broker) == 0)
    assert [d.payload["data"]["id"] for d in receiver.accepted("/ops")] == [request.id]


def test_an_entry_handed_out_too_often_is_dead_lettered(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    stream = broker.keys.stream("default")
    broker.ensure_group(stream, NOTIFIER_GROUP)
    request = broker.create_request(refund())
    ((_, ((entry_id, _),)),) = redis.xreadgroup(NOTIFIER_GROUP, "ghost", {stream: ">"})
    for _ in range(3):  # three more consumers took it and died
        redis.xclaim(stream, NOTIFIER_GROUP, "ghost", 0, [entry_id])
    with running(broker, claim_idle_s=0.3, max_deliveries=4):
        wait_for(lambda: broker.dead_letters())
        wait_for(lambda: pending(broker) == 0)
    ((_, letter),) = broker.dead_letters()
    assert "handed out 5 times" in letter["error"] and letter["f.request_id"] == request.id
    assert receiver.accepted() == []


# ---- the CLI ----------------------------------------------------------------------------


def test_dead_letters_command_lists_and_redrives(
    redis: Redis, redis_url: str, receiver: WebhookReceiver
) -> None:
    receiver.default("/down", 503)
    broker = hook_broker(redis, {"down": webhook(receiver.url("/down"))}, ["webhook:down"])
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    ((letter_id, _),) = broker.dead_letters()
    cli = CliRunner()
    env = {"APPROVAL_BROKER_REDIS_URL": redis_url, "APPROVAL_BROKER_KEY_PREFIX": "t:"}

    listed = cli.invoke(app, ["dead-letters"], env=env)
    assert listed.exit_code == 0
    line = listed.output.strip()
    assert line.startswith(letter_id)
    assert "webhook:down" in line and request.id in line and "approval.requested" in line
    assert "gave up after 3 attempts" in line

    receiver.default("/down", 204)
    redriven = cli.invoke(app, ["dead-letters", "--redrive"], env=env)
    assert redriven.exit_code == 0 and f"{letter_id}: re-driven" in redriven.output
    assert broker.dead_letters() == []
    with running(broker):
        wait_for(lambda: receiver.accepted("/down"))
        wait_for(lambda: settled(broker))
    assert cli.invoke(app, ["dead-letters"], env=env).output.strip() == "no dead letters"
