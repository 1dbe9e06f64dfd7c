"""Integration tests of the notifier fleet against a real Redis and local fakes of Slack,
SMTP (aiosmtpd) and webhook receivers (verifying with the standardwebhooks package)."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis import Redis
from typer.testing import CliRunner

from approval_broker.cli import app
from broker.domain.events import parse_entry
from broker.domain.models import Decision, NewRequest, Outcome, Request
from broker.facade import Broker
from broker.store.keys import NOTIFIER_GROUP
from channels.email.links import read_link
from channels.retry import RETRY_AFTER_LIMIT_S
from notifiers.parking import Parked, ParkedStore
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker  # noqa: F401 - redis, broker, api_broker on both backends
from tests.support.fakes.harness import OLD_SECRET, SECRET, WRONG_SECRET, running, webhook
from tests.support.fakes.slack import FakeSlack, request_id_of
from tests.support.fakes.smtp import SmtpSink
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.notifier_setup import (
    PUBLIC,
    email_section,
    make_broker,
    pending,
    read_all,
    refund,
    settled,
    slack_section,
)
from tests.support.waiting import wait_for


def stat(broker: Broker, name: str) -> int:
    return int(broker.redis.hget(broker.keys.stats, name) or 0)


def delivered_channels(broker: Broker, request_id: str) -> list[str]:
    request = broker.get_request(request_id)
    return sorted(h.channel or "" for h in request.history if h.event == "delivered")


def parked(broker: Broker, channel: str) -> int:
    return ParkedStore(broker, lease_s=1).count(channel)


def messages_about(slack: FakeSlack, request_id: str) -> int:
    """Messages that exist in the fake Slack about a request, however their calls ended."""
    return sum(1 for m in list(slack.messages.values()) if request_id_of(m) == request_id)


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
            "slack": slack_section(slack, channels=("approvals", "managers")),
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
            "slack": slack_section(slack, channels=("approvals", "managers")),
            "approvers": {"alice": {"roles": ["finance"], "slack_user_id": "U0ALICE"}},
        },
    )


def buttons(message: dict[str, Any]) -> list[str]:
    return [
        e["action_id"] for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]
    ]


def test_slack_message_is_updated_in_place_when_decided(redis: Redis, slack: FakeSlack) -> None:
    broker = slack_broker(redis, slack)
    # This test counts updates, so it rules out the two equal updates at-least-once allows: a
    # Slack call slower than slack_timeout_s is tried again (the tests' 1 s, on a busy machine),
    # and a decision made while the post is still being recorded is shown by the post's own
    # re-read of the request and again by the decided event. So: a long timeout, and the
    # decision only once the post is settled.
    with running(broker, slack_timeout_s=10.0):
        request = broker.create_request(refund())
        wait_for(lambda: slack.posts_for(request.id))
        wait_for(lambda: settled(broker))
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
        broker.escalate(request.id, reason="over my limit", decided_by="alice")
        wait_for(lambda: len(slack.posts_for(request.id)) == 2)
        wait_for(lambda: settled(broker, "default") and settled(broker, "managers"))
        broker.decide(request.id, Decision(outcome=Outcome.approved), decided_by="bob")
        wait_for(lambda: settled(broker, "managers"))
    old, new = slack.posts_for(request.id)
    assert (old["channel"], new["channel"]) == ("C1", "C2")
    first = slack.messages[("C1", old["ts"])]  # the copy left behind follows (channels.copies)
    assert buttons(first) == [] and "Escalated to `managers`" in json.dumps(first["blocks"])
    assert "Approved" in json.dumps(first["blocks"])
    second = slack.messages[("C2", new["ts"])]
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


@pytest.mark.parametrize("failure", [500, 0], ids=["5xx-after-posting", "reset-after-posting"])
def test_slack_posting_then_failing_is_looked_up_not_posted_again(
    redis: Redis, slack: FakeSlack, failure: int
) -> None:
    """Slack posted, but the answer was a 5xx or a dropped connection: find it, don't repost."""
    broker = slack_broker(redis, slack)
    slack.fail("chat.postMessage", failure, after_posting=True)
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    assert messages_about(slack, request.id) == 1
    assert slack.arrived("chat.postMessage") == 1  # no SDK retry, no blind repost
    assert slack.calls_to("conversations.history", ok_only=True)
    (note,) = [h for h in broker.get_request(request.id).history if h.event == "delivered"]
    assert "found the earlier post" in (note.detail or "")
    assert broker.dead_letters() == []


def test_a_slack_call_that_times_out_keeps_its_claim_and_posts_once(
    redis: Redis, slack: FakeSlack
) -> None:
    """The post lands after we gave up waiting: the retry finds it rather than posting again."""
    broker = slack_broker(redis, slack)
    slack.delay["chat.postMessage"] = 1.5  # longer than the 1 s timeout
    with running(broker, slack_timeout_s=1.0):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    assert messages_about(slack, request.id) == 1
    assert slack.arrived("chat.postMessage") == 1
    assert broker.dead_letters() == []


def test_without_history_scope_an_unclear_post_is_posted_again_and_logged(
    redis: Redis, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """The documented trade-off when the look-up is refused: a possible duplicate, logged."""
    broker = slack_broker(redis, slack)
    slack.history_allowed = False
    slack.fail("chat.postMessage", 500, after_posting=True)
    with caplog.at_level(logging.WARNING, logger="notifiers"), running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    assert messages_about(slack, request.id) == 2
    assert "posting it again" in caplog.text


def test_slack_retry_after_is_capped(redis: Redis, slack: FakeSlack) -> None:
    broker = slack_broker(redis, slack)
    slack.fail("chat.postMessage", 429, error="ratelimited", retry_after=10**7)
    with running(broker, shutdown_grace_s=0) as notifier:
        broker.create_request(refund())
        channel = notifier.channels["slack:approvals"]
        wait_for(lambda: channel.not_before > 0)
        assert channel.not_before - time.monotonic() <= RETRY_AFTER_LIMIT_S


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
        # the sink speaks no TLS: sending the password in clear is allowed explicitly
        broker = email_broker(
            redis, sink, username="bot", password="s3cret", allow_plaintext_auth=True
        )
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


def test_mail_has_an_escalate_link_where_the_queue_escalates_and_links_name_their_queue(
    redis: Redis, smtp: SmtpSink
) -> None:
    broker = make_broker(
        redis,
        {
            "queues": {
                "default": {"channels": ["email:leads"], "escalate_to": "managers"},
                "managers": {"channels": ["email:bosses"]},
            },
            "email": email_section(
                smtp,
                lists={
                    "leads": {"to": ["lead@example.com"], "unmapped_may_decide": True},
                    "bosses": {"to": ["boss@example.com"], "unmapped_may_decide": True},
                },
            ),
        },
    )
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: len(smtp.mails) == 1)
        broker.escalate(request.id, reason="over my limit", decided_by="lead")
        wait_for(lambda: len(smtp.mails) == 2)
        wait_for(lambda: settled(broker, "default") and settled(broker, "managers"))
    first, second = smtp.to("lead@example.com")[0], smtp.to("boss@example.com")[0]
    claims = [read_link(broker, t, 3600) for t in tokens_in(first.part("plain"))]
    assert sorted(c.action for c in claims) == ["approve", "escalate", "reject"]
    assert {c.queue for c in claims} == {"default"}
    assert "Escalate to managers:" in first.part("plain")
    assert 'data-action="escalate"' in first.part("html")
    claims = [read_link(broker, t, 3600) for t in tokens_in(second.part("plain"))]
    assert sorted(c.action for c in claims) == ["approve", "reject"]  # nowhere further to go
    assert {c.queue for c in claims} == {"managers"}


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


def test_redrive_skips_a_channel_that_finished_after_the_failing_one(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    """The entry's last channel to finish is the good one: its done marker must be written."""
    receiver.delay["/up"] = 0.3
    receiver.default("/down", 503)
    broker = hook_broker(
        redis,
        {
            "up": webhook(receiver.url("/up")),
            "down": webhook(receiver.url("/down"), max_attempts=1),
        },
        ["webhook:up", "webhook:down"],
    )
    with running(broker):
        broker.create_request(refund())
        wait_for(lambda: settled(broker))
        ((letter_id, _),) = broker.dead_letters()
        (down,), (up,) = receiver.to("/down"), receiver.accepted("/up")
        assert down.at < up.at  # dead-lettered before the good channel was done
        receiver.default("/down", 204)
        broker.redrive(letter_id)
        wait_for(lambda: receiver.accepted("/down"))
        wait_for(lambda: settled(broker))
    assert len(receiver.to("/up")) == 1
    assert broker.dead_letters() == []


def test_a_webhook_429_pauses_the_whole_endpoint(redis: Redis, receiver: WebhookReceiver) -> None:
    receiver.plan("/ops", [(429, {"Retry-After": "1"})])
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    with running(broker):
        broker.create_request(refund())
        wait_for(lambda: receiver.to("/ops"))
        second = broker.create_request(refund())
        wait_for(lambda: len(receiver.accepted("/ops")) == 2)
        wait_for(lambda: settled(broker))
    limited = receiver.to("/ops")[0]
    (later,) = [d for d in receiver.accepted("/ops") if d.payload["data"]["id"] == second.id]
    assert limited.status == 429 and later.at - limited.at >= 1.0
    assert len(receiver.to("/ops")) == 3  # the second request waited; it did not try and fail


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


def decided_and_timed_out(
    broker: Broker, callback: str, delivered: Callable[[], bool]
) -> tuple[Request, Request]:
    """With a notifier running: one request with `callback` approved, one timed out, and every
    entry handled once `delivered` holds."""
    with running(broker):
        decided = broker.create_request(refund(callback=callback))
        broker.decide(decided.id, Decision(outcome=Outcome.approved), decided_by="alice")
        timed_out = broker.create_request(refund(callback=callback, timeout_s=0.01))
        wait_for(lambda: broker.sweep())
        wait_for(delivered)
        wait_for(lambda: settled(broker))
    return decided, timed_out


def test_callback_webhook_gets_the_outcome(redis: Redis, receiver: WebhookReceiver) -> None:
    broker = hook_broker(redis, {"cb": webhook(receiver.url("/cb"))}, ["inbox"])
    decided, timed_out = decided_and_timed_out(
        broker, "cb", lambda: len(receiver.accepted("/cb")) == 2
    )
    got = {(d.payload["type"], d.payload["data"]["id"]) for d in receiver.accepted("/cb")}
    assert got == {("approval.decided", decided.id), ("approval.timed_out", timed_out.id)}


def test_a_webhook_is_sent_only_the_event_types_it_names(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    """`events` filters every delivery to an endpoint (its queues' and a callback's); an entry
    none of its channels wants is acknowledged with nothing sent and nothing dead-lettered."""
    broker = hook_broker(
        redis,
        {
            "deciding": webhook(receiver.url("/deciding"), events=["approval.requested"]),
            "audit": webhook(receiver.url("/audit")),
            "outcomes": webhook(receiver.url("/outcomes"), events=["approval.timed_out"]),
        },
        ["webhook:deciding", "webhook:audit"],
    )
    decided, timed_out = decided_and_timed_out(
        broker, "outcomes", lambda: len(receiver.accepted("/audit")) == 4
    )

    def got(path: str) -> list[tuple[str, str]]:
        return sorted((d.payload["type"], d.payload["data"]["id"]) for d in receiver.to(path))

    assert got("/deciding") == sorted(
        [("approval.requested", decided.id), ("approval.requested", timed_out.id)]
    )
    assert got("/audit") == sorted(
        [
            ("approval.requested", decided.id),
            ("approval.decided", decided.id),
            ("approval.requested", timed_out.id),
            ("approval.timed_out", timed_out.id),
        ]
    )
    assert got("/outcomes") == [("approval.timed_out", timed_out.id)]
    assert broker.dead_letters() == []


# ---- the loop ---------------------------------------------------------------------------


def test_a_hung_channel_does_not_hold_up_the_others(
    redis: Redis, receiver: WebhookReceiver, slack: FakeSlack
) -> None:
    """Slack hangs and max_inflight is small: its deliveries are parked, entries acked, webhooks
    keep flowing; when Slack recovers every request is posted exactly once."""
    broker = make_broker(
        redis,
        {
            "queues": {"default": {"channels": ["slack:approvals", "webhook:ops"]}},
            "webhooks": {"ops": webhook(receiver.url("/ops"))},
            "slack": slack_section(slack, channels=("approvals", "managers")),
        },
    )
    slack.hold()
    with running(broker, max_inflight=5, park_after_s=0.2, slack_timeout_s=15):
        requests = [broker.create_request(refund()) for _ in range(12)]
        wait_for(lambda: len(receiver.accepted("/ops")) == 12)
        # entries beyond max_inflight were acknowledged with their Slack share parked
        wait_for(lambda: parked(broker, "slack:approvals") >= 12 - 5)
        wait_for(lambda: read_all(broker))  # the reader was never stuck behind Slack
        # Slack was called (one call per Slack thread, each hanging), nothing more was taken
        assert slack.arrived("chat.postMessage") == 4
        slack.release()
        wait_for(lambda: all(slack.posts_for(r.id) for r in requests))
        wait_for(lambda: parked(broker, "slack:approvals") == 0 and settled(broker))
    assert [len(slack.posts_for(r.id)) for r in requests] == [1] * 12
    assert slack.arrived("chat.postMessage") == 12
    assert all(
        delivered_channels(broker, r.id) == ["slack:approvals", "webhook:ops"] for r in requests
    )
    assert stat(broker, "parked:slack") >= 12 - 5 and broker.dead_letters() == []


def test_a_parked_delivery_is_dead_lettered_after_its_last_try(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    """Parking carries the attempt count: three tries in all, then the dead letter."""
    receiver.default("/down", 503)
    slow = webhook(receiver.url("/down"), backoff_s=0.6, max_backoff_s=0.6)
    broker = hook_broker(redis, {"down": slow}, ["webhook:down"])
    with running(broker, max_inflight=1, park_after_s=0.1):
        for _ in range(3):
            broker.create_request(refund())
        wait_for(lambda: len(broker.dead_letters()) == 3)
        wait_for(lambda: settled(broker) and parked(broker, "webhook:down") == 0)
    assert stat(broker, "parked:webhook") >= 1
    assert len(receiver.to("/down")) == 9
    for _, letter in broker.dead_letters():
        assert "gave up after 3 attempts" in letter["error"] and letter["attempts"] == "3"


def test_a_parked_delivery_whose_lease_lapsed_is_taken_over(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    """What a SIGKILLed notifier was working on is delivered by another."""
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    request = broker.create_request(refund())
    stream = broker.keys.of_request(request.id).stream("default")  # its partition's
    redis.xgroup_create(stream, NOTIFIER_GROUP, id="$")  # the entry itself was acked long ago
    ((entry_id, raw),) = redis.xrange(stream)
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    event = parse_entry(stream, "default", entry_id.decode(), fields)
    ParkedStore(broker, lease_s=30).park(
        [(Parked.of(event, "webhook:ops", attempts=1, defers=0), time.time() - 1)]
    )
    with running(broker):
        wait_for(lambda: receiver.accepted("/ops"))
        wait_for(lambda: parked(broker, "webhook:ops") == 0)
    (delivery,) = receiver.accepted("/ops")
    assert delivery.payload["data"]["id"] == request.id
    assert delivery.id == event.webhook_id("webhook:ops")
    assert delivered_channels(broker, request.id) == ["webhook:ops"]
    assert redis.hexists(broker.keys.delivery(request.id), event.done_field("webhook:ops"))


def test_bookkeeping_refused_by_redis_is_not_repeated_and_acks_go_on(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    """One done marker Redis refuses (WRONGTYPE) must not stop every ack or double the notes."""
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    poisoned = broker.create_request(refund())
    redis.set(broker.keys.delivery(poisoned.id), "not a hash")
    fine = broker.create_request(refund())
    with running(broker):
        wait_for(lambda: len(receiver.accepted("/ops")) == 2)
        wait_for(lambda: settled(broker))
        later = broker.create_request(refund())
        wait_for(lambda: settled(broker) and len(receiver.accepted("/ops")) == 3)
    assert stat(broker, "delivered:webhook") == 3
    for r in (poisoned, fine, later):
        assert delivered_channels(broker, r.id) == ["webhook:ops"]


def test_the_reader_survives_an_unexpected_error(
    redis: Redis, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    with running(broker, claim_idle_s=0.5) as notifier:
        real, calls = notifier.router.fetch, []

        def flaky(ids: set[str]) -> Any:
            calls.append(ids)
            if len(calls) == 1:
                raise RuntimeError("a bug")
            return real(ids)

        monkeypatch.setattr(notifier.router, "fetch", flaky)
        first = broker.create_request(refund())
        wait_for(lambda: calls)
        second = broker.create_request(refund())
        wait_for(lambda: len(receiver.accepted("/ops")) == 2)
        wait_for(lambda: settled(broker))
    assert {d.payload["data"]["id"] for d in receiver.accepted("/ops")} == {first.id, second.id}


def test_a_broken_committer_stops_the_notifier(
    redis: Redis, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rather than a dead thread and entries never acked, the notifier fails loudly."""
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    with running(broker) as notifier:

        def broken(batch: Any) -> Any:
            raise RuntimeError("a bug")

        monkeypatch.setattr(notifier.committer, "plan", broken)
        broker.create_request(refund())
        wait_for(notifier.failed.is_set)
    assert "committer failed: RuntimeError: a bug" in (notifier.error or "")
    assert pending(broker) == 1  # left for another notifier to reclaim


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
    request = broker.create_request(refund())
    gone = broker.create_request(refund())
    stream = broker.keys.of_request(gone.id).stream("default")  # its partition's
    for made in (request, gone):  # read, then "crashed"
        mine = broker.keys.of_request(made.id).stream("default")
        broker.ensure_group(mine, NOTIFIER_GROUP)
        redis.xreadgroup(NOTIFIER_GROUP, "ghost", {mine: ">"})
    assert pending(broker) == 2
    gone_entry = [eid for eid, f in redis.xrange(stream) if f[b"request_id"] == gone.id.encode()]
    redis.xdel(stream, *gone_entry)  # one of its entries was trimmed meanwhile
    with running(broker, claim_idle_s=0.3):
        wait_for(lambda: receiver.accepted("/ops"))
        wait_for(lambda: pending(broker) == 0)
    assert [d.payload["data"]["id"] for d in receiver.accepted("/ops")] == [request.id]
    ((_, letter),) = broker.dead_letters()
    assert letter["error"].startswith("trimmed before delivery")
    assert letter["entry_id"] == gone_entry[0].decode() and letter["from_stream"] == stream
    assert stat(broker, "failed:entry") == 1


def test_an_entry_handed_out_too_often_is_dead_lettered(
    redis: Redis, receiver: WebhookReceiver
) -> None:
    broker = hook_broker(redis, {"ops": webhook(receiver.url("/ops"))}, ["webhook:ops"])
    request = broker.create_request(refund())
    stream = broker.keys.of_request(request.id).stream("default")  # its partition's
    broker.ensure_group(stream, NOTIFIER_GROUP)
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
    redis: Redis, backend_env: dict[str, str], receiver: WebhookReceiver
) -> None:
    receiver.default("/down", 503)
    broker = hook_broker(redis, {"down": webhook(receiver.url("/down"))}, ["webhook:down"])
    with running(broker):
        request = broker.create_request(refund())
        wait_for(lambda: settled(broker))
    ((letter_id, _),) = broker.dead_letters()
    cli = CliRunner()
    env = {**backend_env, "APPROVAL_BROKER_KEY_PREFIX": "t:"}

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
