"""Unit tests of the notifier's pure parts: back-off, signing, parsing, rendering."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from redis import Redis
from standardwebhooks import Webhook, WebhookVerificationError

from broker.domain.args_hash import args_hash
from broker.domain.config import parse_config
from broker.domain.events import (
    ACKED,
    ESCALATED,
    EVENT_TYPES,
    NO_CHANNEL,
    REQUESTED,
    MalformedEntry,
    parse_entry,
)
from broker.domain.models import Decision, HistoryEntry, Outcome, Request, Status
from broker.facade import Broker
from channels.copies import claim_stale_s
from channels.email.render import Link, render_mail
from channels.email.sender import link_actions, parse_smtp_url
from channels.retry import (
    RETRY_AFTER_LIMIT_S,
    RetryPolicy,
    cap_retry_after,
    parse_retry_after,
    pause_delay,
)
from channels.sender import Sender
from channels.slack import action_ids as slack_ids
from channels.slack.blocks import render
from channels.slack.config import SlackConfig
from channels.slack.sender import slack_client
from channels.webhook.config import WEBHOOK_EVENT_TYPES
from channels.webhook.sender import Signer, signature_headers, webhook_body
from notifiers.dispatch import Dispatcher
from notifiers.parking import ParkedStore
from notifiers.tasks import InflightEntry, Task
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker  # noqa: F401 - redis, broker, api_broker on both backends
from tests.support.fakes.harness import OLD_SECRET, SECRET, WRONG_SECRET
from tests.support.waiting import wait_for

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def make_request(**fields: object) -> Request:
    base: dict[str, object] = {
        "id": "req_1",
        "tool_call_id": "call_1",
        "tool_name": "refund",
        "args": {"order_id": "A1", "amount": 120},
        "args_hash": args_hash({"order_id": "A1", "amount": 120}),
        "prompt": "Refund order A1 (120 EUR)?",
        "created_at": NOW,
        "expires_at": NOW + timedelta(minutes=10),
    }
    return Request.model_validate(base | fields)


CONFIG = parse_config(
    {
        "queues": {
            "default": {"channels": ["slack:approvals"], "escalate_to": "managers"},
            "managers": {"channels": ["slack:managers"]},
        },
        "slack": {
            "bot_token": "x",
            "signing_secret": "y",
            "channels": {"approvals": {"channel": "C1"}, "managers": {"channel": "C2"}},
        },
        "approvers": {"alice": {"roles": ["finance"], "slack_user_id": "U0ALICE"}},
    }
)


# ---- back-off ----------------------------------------------------------------------------


def test_backoff_grows_exponentially_with_jitter_and_stops_at_the_cap() -> None:
    policy = RetryPolicy(max_attempts=10, base_s=1.0, cap_s=8.0)
    assert [policy.delay(n, rand=lambda: 0.0) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 4, 4]
    assert [policy.delay(n, rand=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 8, 8]


def test_retry_after_is_a_floor_for_the_delay() -> None:
    policy = RetryPolicy(max_attempts=3, base_s=0.1, cap_s=1.0)
    assert policy.delay(1, retry_after=7, rand=lambda: 0.5) == 7
    assert policy.delay(1, retry_after=0, rand=lambda: 0.0) == 0.05


def test_retry_after_parses_seconds_and_http_dates() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0 ") == 0.0
    now = datetime.now(UTC)
    assert parse_retry_after(
        format_datetime(now + timedelta(seconds=90), usegmt=True), now.timestamp()
    ) == pytest.approx(90, abs=1)
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_retry_after_is_capped_and_pauses_get_jitter() -> None:
    assert cap_retry_after(10**9) == RETRY_AFTER_LIMIT_S
    assert cap_retry_after(-5) == 0
    assert RetryPolicy(3, 0.1, 1.0).delay(1, retry_after=10**9, rand=lambda: 0) == (
        RETRY_AFTER_LIMIT_S
    )
    assert pause_delay(10, rand=lambda: 0.0) == 10
    assert 10 < pause_delay(10, rand=lambda: 1.0) <= 11
    assert pause_delay(3600, rand=lambda: 1.0) == 3601  # at most a second on top


class _Paused(Sender):
    kind = "test"

    def deliver(self, task: Task) -> str | None:  # pragma: no cover - never reached
        raise AssertionError("a paused channel must not be called")


def test_tasks_waiting_out_one_pause_wake_at_different_times(redis: Redis) -> None:
    """A paused channel's tasks are spread out after the pause, not all sent at one instant."""
    channel = _Paused("test:paused", policy=RetryPolicy(3, 0.1, 1.0), concurrency=2)
    channel.not_before = time.monotonic() + 60
    store = ParkedStore(Broker(redis, CONFIG, prefix="t:"), lease_s=5)
    dispatcher = Dispatcher({channel.name: channel}, lambda o: None, lambda t, e: None, store)
    try:
        event = parse_entry("s", "default", "1-0", {"type": REQUESTED, "request_id": "r"})
        tasks = [Task(InflightEntry(event, None), channel.name) for _ in range(20)]
        for task in tasks:
            dispatcher.submit(task)
        wait_for(lambda: all(t.due for t in tasks))
        dues = [t.due for t in tasks]
        assert all(due >= channel.not_before for due in dues)
        assert max(dues) - min(dues) > 0.1  # not one instant (a float's noise apart)
        assert all(t.attempts == 0 for t in tasks)  # a pause is not an attempt
    finally:
        dispatcher.close()


# ---- Standard Webhooks ------------------------------------------------------------------


def test_signature_verifies_with_standardwebhooks_for_every_secret_in_force() -> None:
    body = '{"type":"approval.requested"}'
    headers = signature_headers("msg_1", body.encode(), [Signer(SECRET), Signer(OLD_SECRET)])
    assert headers["webhook-id"] == "msg_1"
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert all(s.startswith("v1,") for s in headers["webhook-signature"].split(" "))
    Webhook(SECRET).verify(body, headers)
    Webhook(OLD_SECRET).verify(body, headers)  # a receiver still on the old secret
    # the contract itself, computed without the library that signed
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"msg_1.{headers['webhook-timestamp']}.{body}".encode()
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert f"v1,{expected}" in headers["webhook-signature"].split(" ")
    with pytest.raises(WebhookVerificationError):
        Webhook(WRONG_SECRET).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body + " ", headers)


def test_webhook_body_is_the_contract_and_stable_across_retries() -> None:
    event = parse_entry(
        "ab:stream:default",
        "default",
        "1735787045000-0",
        {"type": REQUESTED, "request_id": "req_1", "queue": "default"},
    )
    request = make_request()
    body = webhook_body(event, request)
    assert body == webhook_body(event, request)
    payload = json.loads(body)
    assert set(payload) == {"type", "timestamp", "data"}
    assert payload["type"] == "approval.requested"
    assert datetime.fromisoformat(payload["timestamp"]) == datetime.fromtimestamp(1735787045, UTC)
    assert payload["data"] == request.public()


def test_webhook_id_is_stable_per_event_and_endpoint() -> None:
    fields = {"type": REQUESTED, "request_id": "req_1", "queue": "default"}
    first = parse_entry("s", "default", "1-0", fields)
    redriven = parse_entry("s", "default", "9-0", {**fields, "event_id": "1-0"})
    other = parse_entry("s", "default", "2-0", fields)
    assert first.webhook_id("webhook:a") == redriven.webhook_id("webhook:a")
    assert first.webhook_id("webhook:a") != first.webhook_id("webhook:b")
    assert first.webhook_id("webhook:a") != other.webhook_id("webhook:a")


# ---- entries ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"request_id": "r"}, "unknown event type"),
        ({"type": "approval.exploded", "request_id": "r"}, "unknown event type"),
        ({"type": REQUESTED}, "request_id"),
        ({"type": ESCALATED, "request_id": "r", "from": "a"}, "'from' and 'to'"),
        ({"type": REQUESTED, "request_id": "r", "event_id": "nope"}, "not a stream id"),
    ],
)
def test_malformed_entries_are_refused_with_the_reason(
    fields: dict[str, str], problem: str
) -> None:
    with pytest.raises(MalformedEntry, match=problem):
        parse_entry("s", "default", "1-0", fields)


def test_escalation_seen_from_the_queue_it_left_is_an_update_only() -> None:
    fields = {"type": ESCALATED, "request_id": "r", "from": "default", "to": "managers"}
    assert parse_entry("s", "default", "1-0", fields).moved_away
    assert not parse_entry("s", "managers", "1-0", fields).moved_away


# ---- email ------------------------------------------------------------------------------


def test_smtp_urls() -> None:
    plain = parse_smtp_url("smtp://mail.example.com")
    assert (plain.host, plain.port, plain.implicit_tls) == ("mail.example.com", 25, False)
    tls = parse_smtp_url("smtps://u%40x:p%3Aw@mail.example.com:2465")
    assert (tls.port, tls.implicit_tls, tls.username, tls.password) == (2465, True, "u@x", "p:w")
    with pytest.raises(ValueError, match="smtp://"):
        parse_smtp_url("http://mail.example.com")
    with pytest.raises(ValueError, match="no host"):
        parse_smtp_url("smtp://")


def test_link_actions_follow_the_kind() -> None:
    assert link_actions(make_request(queue="managers"), CONFIG) == ["approve", "reject"]
    assert link_actions(make_request(kind="question", queue="managers"), CONFIG) == [
        "answer",
        "reject",
    ]
    assert link_actions(make_request(), CONFIG) == ["approve", "reject", "escalate"]


def test_mail_and_slack_say_who_may_decide_the_same_way() -> None:
    request = make_request(allowed_roles=["finance", "ops"])
    links = [Link("approve", "https://x/1"), Link("escalate", "https://x/2", "managers")]
    _, text, html = render_mail(request, CONFIG, "a@example.com", links, NOW)
    assert "people with role finance or ops" in text
    assert "Escalate to managers:" in text and 'data-action="escalate"' in html
    _, blocks = render(request, CONFIG, "slack:approvals")
    assert "people with role `finance` or `ops` (<@U0ALICE>)" in json.dumps(blocks)
    _, anyone, _ = render_mail(make_request(), CONFIG, "a@example.com", links, NOW)
    assert "Who may decide: any approver" in anyone


# ---- Slack delivery ---------------------------------------------------------------------


def test_slack_client_never_resends_on_its_own() -> None:
    client = slack_client(SlackConfig(bot_token="x", signing_secret="y"), 15)
    assert client.retry_handlers == []


def test_a_posting_claim_outlives_the_slowest_call() -> None:
    assert claim_stale_s(claim_idle_s=30, timeout_s=15) > 3 * 15
    assert claim_stale_s(claim_idle_s=1, timeout_s=1) > 3
    assert claim_stale_s(claim_idle_s=600, timeout_s=15) == 600


# ---- Slack blocks -----------------------------------------------------------------------


def _elements(blocks: list[dict]) -> list[dict]:
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


def test_pending_approval_has_buttons_carrying_the_request_id() -> None:
    text, blocks = render(make_request(allowed_roles=["finance"]), CONFIG, "slack:approvals")
    buttons = _elements(blocks)
    assert [b["action_id"] for b in buttons] == ["approve", "reject", "escalate"]
    assert {b["value"] for b in buttons} == {"req_1"}
    assert [b for b in blocks if b.get("block_id") == slack_ids.actions_block_id("req_1")]
    shown = json.dumps(blocks)
    assert "refund" in shown and "A1" in shown and "<@U0ALICE>" in shown and "<!date^" in shown
    assert "Refund order A1" in text


def test_no_escalate_button_without_escalate_to() -> None:
    _, blocks = render(make_request(queue="managers"), CONFIG, "slack:managers")
    assert "escalate" not in [b["action_id"] for b in _elements(blocks)]


def test_question_with_options_gets_option_buttons() -> None:
    request = make_request(kind="question", metadata={"options": ["yes", "no"]})
    _, blocks = render(request, CONFIG, "slack:approvals")
    ids = [b["action_id"] for b in _elements(blocks)]
    assert ids[:2] == ["answer:yes", "answer:no"]
    assert slack_ids.parse_action(ids[0]) == ("answer", "yes")
    assert not [b for b in blocks if b["type"] == "input"]


def test_open_question_gets_a_text_input_and_an_answer_button() -> None:
    _, blocks = render(make_request(kind="question"), CONFIG, "slack:approvals")
    (field,) = [b for b in blocks if b["type"] == "input"]
    assert field["block_id"] == slack_ids.ANSWER_BLOCK
    assert field["element"]["action_id"] == slack_ids.ANSWER_TEXT
    assert "answer" in [b["action_id"] for b in _elements(blocks)]


def test_decided_request_shows_who_what_when_and_no_buttons() -> None:
    decision = Decision(
        outcome=Outcome.rejected, reason="too much", decided_by="alice", decided_at=NOW
    )
    request = make_request(status=Status.rejected, decision=decision)
    text, blocks = render(request, CONFIG, "slack:approvals")
    assert not _elements(blocks)
    shown = json.dumps(blocks)
    assert "Rejected" in shown and "<@U0ALICE>" in shown and "too much" in shown
    assert "rejected" in text


def test_request_that_left_the_channel_says_where_it_went() -> None:
    moved = HistoryEntry(
        at=NOW, event="escalated", by="sweeper", from_queue="default", to_queue="managers"
    )
    request = make_request(queue="managers", history=[moved])
    _, blocks = render(request, CONFIG, "slack:approvals")
    assert not _elements(blocks)
    assert "Escalated to `managers`" in json.dumps(blocks)
    _, there = render(request, CONFIG, "slack:managers")
    assert _elements(there)


def test_markup_in_prompts_is_escaped() -> None:
    _, blocks = render(make_request(prompt="<!channel> & <@U1>"), CONFIG, "slack:approvals")
    shown = json.dumps(blocks)
    assert "<!channel>" not in shown and "&lt;!channel&gt; &amp; &lt;@U1&gt;" in shown


def test_reject_modal_carries_the_request() -> None:
    view = slack_ids.reject_modal("req_9", "refund")
    assert view["callback_id"] == slack_ids.REJECT_CALLBACK
    assert view["private_metadata"] == "req_9"


def test_the_config_knows_every_event_type_a_webhook_is_sent() -> None:
    """`[webhooks.NAME] events` is checked against the types the notifier sends webhooks: every
    event type but the ack (Slack's only) and those no channel is sent (a refused receipt, a
    shadow rule's match)."""
    assert set(WEBHOOK_EVENT_TYPES) == set(EVENT_TYPES) - {ACKED} - NO_CHANNEL
