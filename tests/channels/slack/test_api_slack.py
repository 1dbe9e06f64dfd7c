"""Slack interactivity: v0 signatures (forged, stale, replayed), buttons, the reason modal, roles."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis
from slack_sdk.signature import SignatureVerifier

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest, Request
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.slack import action_ids as ids
from tests.support.backends import (  # noqa: F401 - redis, broker, api_broker on both backends
    on_backend,
    on_backend_api_broker,
    on_backend_broker,
    stream_entries,
)
from tests.support.slack_api import SIGNING_SECRET, FakeSlack, click, send, signed, slack_cfg  # noqa: F401
from tests.support.waiting import wait_for


def make(broker: Broker, **kw: Any) -> Request:
    kw.setdefault("tool_name", "refund")
    kw.setdefault("args", {"amount": 120})
    return broker.create_request(NewRequest(**kw))


def submit_reason(
    request_id: str, reason: str, user: str = "U_ALICE", channel: str | None = "C1"
) -> dict[str, Any]:
    return {
        "type": "view_submission",
        "user": {"id": user},
        "view": {
            "callback_id": ids.REJECT_CALLBACK,
            "private_metadata": f"{request_id} {channel}" if channel else request_id,
            "state": {
                "values": {
                    ids.REJECT_REASON_BLOCK: {
                        ids.REJECT_REASON_ACTION: {"type": "plain_text_input", "value": reason}
                    }
                }
            },
        },
    }


def test_approve_button_decides_as_the_mapped_approver(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker)
    resp = send(client, *signed(click(ids.APPROVE, req.id)))
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "approved"
    stored = api_broker.get_request(req.id)
    assert stored.status.value == "approved" and stored.decision is not None
    assert stored.decision.decided_by == "alice"


def test_a_slack_user_the_config_does_not_name_decides_nothing(
    client: TestClient, api_broker: Broker
) -> None:
    """Guests and Slack Connect members see the buttons too: only configured approvers count."""
    open_req = make(api_broker)
    resp = send(client, *signed(click(ids.APPROVE, open_req.id, user="U_NEW")))
    assert resp.status_code == 200 and resp.json()["error"] == "forbidden"
    assert "U_NEW is not an approver" in resp.json()["text"]
    assert api_broker.get_request(open_req.id).is_pending
    resp = send(client, *signed(click(ids.REJECT, open_req.id, user="U_NEW")))
    assert resp.json()["error"] == "forbidden"
    assert api_broker.get_request(open_req.id).is_pending


def test_user_without_the_role_is_told_and_nothing_is_decided(
    client: TestClient, api_broker: Broker, fake_slack: FakeSlack
) -> None:
    req = make(api_broker, allowed_roles=["finance"])
    hook = f"{fake_slack.url}/actions/T1/123/abc"
    resp = send(client, *signed(click(ids.APPROVE, req.id, user="U_BOB", response_url=hook)))
    assert resp.status_code == 200
    body = resp.json()
    assert body["error"] == "forbidden" and body["response_type"] == "ephemeral"
    assert body["text"] == "You may not decide this request from here."  # no role, no queue
    assert api_broker.get_request(req.id).is_pending
    wait_for(lambda: "/actions/T1/123/abc" in fake_slack.paths())
    posted = dict(fake_slack.calls)["/actions/T1/123/abc"]
    assert posted["response_type"] == "ephemeral" and posted["replace_original"] is False
    # and the reject button does not open the modal for them either
    resp = send(client, *signed(click(ids.REJECT, req.id, user="U_BOB")))
    assert resp.json()["error"] == "forbidden"
    assert not any(p.endswith("views.open") for p in fake_slack.paths())


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda p: signed(p, secret="not-the-secret"), id="forged"),
        pytest.param(lambda p: signed(p, age_s=360), id="stale-6-minutes"),
        pytest.param(
            lambda p: (signed(p)[0], {**signed(p)[1], "X-Slack-Signature": "v0=00"}),
            id="wrong-signature",
        ),
        pytest.param(
            lambda p: (signed(p)[0], {**signed(p)[1], "X-Slack-Request-Timestamp": "soon"}),
            id="bad-timestamp",
        ),
        *[
            pytest.param(
                lambda p, stamp=stamp: (
                    signed(p)[0],
                    {**signed(p)[1], "X-Slack-Request-Timestamp": stamp},
                ),
                id=f"timestamp-{name}",
            )
            for name, stamp in {
                "400-digits": "9" * 400,
                "5000-digits": "1" * 5000,
                "negative-400-digits": "-" + "9" * 400,
                "float": "1.7e9",
                "signed": "+1700000000",
                "empty": "",
            }.items()
        ],
        pytest.param(
            lambda p: (signed(p)[0].replace(b"U_ALICE", b"U_ALICF"), signed(p)[1]),
            id="tampered",
        ),
        pytest.param(lambda p: (signed(p)[0], {}), id="unsigned"),
    ],
)
def test_bad_signatures_are_401_before_parsing(
    client: TestClient, api_broker: Broker, forge: Any
) -> None:
    req = make(api_broker)
    resp = send(client, *forge(click(ids.APPROVE, req.id)))
    assert resp.status_code == 401
    assert resp.json()["error"] == "bad_signature"
    assert api_broker.get_request(req.id).is_pending


def test_replayed_request_is_refused(client: TestClient, api_broker: Broker) -> None:
    first, second = make(api_broker), make(api_broker)
    body, headers = signed(click(ids.APPROVE, first.id))
    assert send(client, body, headers).status_code == 200
    replay = send(client, body, headers)
    assert replay.status_code == 409 and replay.json()["error"] == "replayed"
    # nothing else changed: two requests created, one decided
    assert len(stream_entries(api_broker)) == 3
    assert api_broker.get_request(second.id).is_pending


def test_reject_opens_the_modal_and_the_submission_rejects_with_reason(
    client: TestClient, api_broker: Broker, fake_slack: FakeSlack
) -> None:
    req = make(api_broker)
    payload = click(ids.REJECT, req.id)
    resp = send(client, *signed(payload))
    assert resp.status_code == 200 and resp.json()["status"] == "pending"
    (opened,) = [body for path, body in fake_slack.calls if path == "/api/views.open"]
    assert opened["trigger_id"] == payload["trigger_id"]
    assert opened["view"]["callback_id"] == ids.REJECT_CALLBACK
    assert opened["view"]["private_metadata"] == f"{req.id} C1"  # the request and its channel
    assert api_broker.get_request(req.id).is_pending
    resp = send(client, *signed(submit_reason(req.id, "  over budget ")))
    assert resp.status_code == 200 and resp.json() == {"response_action": "clear"}
    stored = api_broker.get_request(req.id)
    assert stored.status.value == "rejected" and stored.decision is not None
    assert stored.decision.reason == "over budget" and stored.decision.decided_by == "alice"


def test_modal_submission_errors_show_in_the_modal(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker, allowed_roles=["finance"])
    resp = send(client, *signed(submit_reason(req.id, "no", user="U_BOB")))
    assert resp.status_code == 200
    assert resp.json()["response_action"] == "errors"
    assert ids.REJECT_REASON_BLOCK in resp.json()["errors"]
    assert api_broker.get_request(req.id).is_pending
    api_broker.decide(req.id, _approved(), decided_by="carol")
    resp = send(client, *signed(submit_reason(req.id, "no")))
    assert "carol" in resp.json()["errors"][ids.REJECT_REASON_BLOCK]


def _approved() -> Any:
    from broker.domain.models import Decision, Outcome

    return Decision(outcome=Outcome.approved)


def test_views_open_failure_is_reported_and_decides_nothing(
    client: TestClient, api_broker: Broker, fake_slack: FakeSlack
) -> None:
    fake_slack.fail_views_open = True
    req = make(api_broker)
    resp = send(client, *signed(click(ids.REJECT, req.id)))
    assert resp.status_code == 200 and resp.json()["error"] == "slack"
    assert api_broker.get_request(req.id).is_pending


def test_answers_from_option_buttons_and_the_text_box(
    client: TestClient, api_broker: Broker
) -> None:
    q1, q2 = make(api_broker, kind="question"), make(api_broker, kind="question")
    resp = send(client, *signed(click(ids.option_action_id("yes, ship it"), q1.id)))
    assert resp.json()["status"] == "answered"
    assert api_broker.get_request(q1.id).decision.answer == "yes, ship it"  # type: ignore[union-attr]
    empty = {"values": {ids.ANSWER_BLOCK: {ids.ANSWER_TEXT: {"value": None}}}}
    resp = send(client, *signed(click(ids.ANSWER, q2.id, state=empty)))
    assert resp.json()["error"] == "invalid" and api_broker.get_request(q2.id).is_pending
    typed = {"values": {ids.ANSWER_BLOCK: {ids.ANSWER_TEXT: {"value": "42 units"}}}}
    resp = send(client, *signed(click(ids.ANSWER, q2.id, state=typed)))
    assert resp.json()["status"] == "answered"
    assert api_broker.get_request(q2.id).decision.answer == "42 units"  # type: ignore[union-attr]


def test_escalate_and_a_late_click_names_the_winner(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    resp = send(client, *signed(click(ids.ESCALATE, req.id)))
    assert resp.json()["status"] == "pending"
    assert api_broker.get_request(req.id).queue == "managers"
    assert send(client, *signed(click(ids.APPROVE, req.id, user="U_BOB"))).status_code == 200
    late = send(client, *signed(click(ids.APPROVE, req.id, user="U_ALICE")))
    assert late.status_code == 200 and late.json()["error"] == "conflict"
    assert "bob" in late.json()["text"]
    again = send(client, *signed(click(ids.APPROVE, req.id, user="U_BOB")))  # double click
    assert again.json()["status"] == "approved"


def test_malformed_or_unknown_payloads(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker)
    body, headers = signed({"type": "block_actions"})
    assert send(client, body, headers).status_code == 400
    raw = b"payload=not-json"
    ts = str(int(time.time()))
    sig = SignatureVerifier(SIGNING_SECRET).generate_signature(timestamp=ts, body=raw)
    resp = send(client, raw, {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sig or ""})
    assert resp.status_code == 400 and resp.json()["error"] == "bad_request"
    other = send(client, *signed({"type": "shortcut", "user": {"id": "U_ALICE"}}))
    assert other.status_code == 200
    typing = send(client, *signed(click(ids.ANSWER_TEXT, req.id)))  # the text box itself
    assert typing.status_code == 200 and api_broker.get_request(req.id).is_pending
    no_option = send(client, *signed(click(ids.option_action_id(""), req.id)))
    assert no_option.status_code == 200 and api_broker.get_request(req.id).is_pending
    long_reason = send(client, *signed(submit_reason(req.id, "x" * 10_001)))
    assert long_reason.json()["response_action"] == "errors"
    assert api_broker.get_request(req.id).is_pending


def test_slack_not_configured_is_404(redis: Redis) -> None:
    cfg = parse_config({})
    with TestClient(create_app(Settings(), cfg, Broker(redis, cfg, prefix="t:"))) as c:
        resp = c.post("/v1/slack/interactions", content=b"payload=%7B%7D")
        assert resp.status_code == 404 and resp.json()["error"] == "not_configured"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def test_signed_but_strange_payloads_never_get_a_5xx(
    client: TestClient, api_broker: Broker
) -> None:
    """Anything Slack could sign gets a 2xx/4xx JSON answer, never a 500."""
    req = make(api_broker)

    @settings(
        max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        kind=st.sampled_from(["block_actions", "view_submission", "shortcut", None]),
        action_id=st.sampled_from([ids.APPROVE, ids.REJECT, ids.ANSWER, "answer:", "x"])
        | st.text(max_size=10),
        value=st.sampled_from([req.id, "", None]) | json_values,
        user=st.sampled_from([{"id": "U_ALICE"}, {}, None]) | json_values,
        extra=st.dictionaries(
            st.sampled_from(["state", "view", "actions", "trigger_id"]), json_values
        ),
    )
    def run(kind: Any, action_id: Any, value: Any, user: Any, extra: dict[str, Any]) -> None:
        payload: dict[str, Any] = {
            "type": kind,
            "user": user,
            "actions": [{"action_id": action_id, "value": value}],
            **extra,
        }
        resp = send(client, *signed(payload))
        assert resp.status_code < 500, resp.text
        assert resp.headers["content-type"].startswith("application/json")

    run()


# ---- a click spends its signature only with its decision; channels and queue roles -------


def test_a_click_whose_decision_failed_can_be_sent_again(
    cfg: Config, api_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis gone in the middle of the decision: the same signed click still counts later."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    req = make(api_broker)
    body, headers = signed(click(ids.APPROVE, req.id))

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError("Connection reset by peer")

    monkeypatch.setattr(api_broker.decisions, "decide", unreachable)
    app = create_app(Settings(), cfg, api_broker)
    with TestClient(app, raise_server_exceptions=False) as c:
        failed = send(c, body, headers)
        assert failed.status_code == 503 and failed.json()["error"] == "unavailable"
        assert api_broker.get_request(req.id).is_pending
        monkeypatch.undo()
        again = send(c, body, headers)  # the very same signed click
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "approved"
        assert send(c, body, headers).json()["error"] == "replayed"  # now it is spent
    decision = api_broker.get_request(req.id).decision
    assert decision is not None and decision.decided_by == "alice"


def test_a_click_from_a_channel_outside_the_requests_queue_decides_nothing(
    client: TestClient, api_broker: Broker, fake_slack: FakeSlack
) -> None:
    req = make(api_broker, queue="money")  # decided in slack:money (C2) only
    for channel in ("C1", "C_UNKNOWN"):
        resp = send(client, *signed(click(ids.APPROVE, req.id, channel=channel)))
        assert resp.status_code == 200 and resp.json()["error"] == "forbidden"
        assert resp.json()["text"] == "You may not decide this request from here."
        resp = send(client, *signed(click(ids.REJECT, req.id, channel=channel)))
        assert resp.json()["error"] == "forbidden"
    assert not any(p.endswith("views.open") for p in fake_slack.paths())
    resp = send(client, *signed(submit_reason(req.id, "no", channel="C1")))
    assert resp.json()["response_action"] == "errors" and resp.json()["error"] == "forbidden"
    assert api_broker.get_request(req.id).is_pending
    resp = send(client, *signed(submit_reason(req.id, "no", channel="C2")))
    assert resp.json() == {"response_action": "clear"}
    assert api_broker.get_request(req.id).status.value == "rejected"


def test_queue_roles_hold_for_slack_clicks(client: TestClient, api_broker: Broker) -> None:
    req = make(api_broker, queue="money")  # no allowed_roles, but the queue wants finance
    resp = send(client, *signed(click(ids.APPROVE, req.id, user="U_BOB", channel="C2")))
    assert resp.json()["error"] == "forbidden"
    assert "money" not in resp.json()["text"] and "finance" not in resp.json()["text"]
    assert api_broker.get_request(req.id).is_pending
    resp = send(client, *signed(click(ids.APPROVE, req.id, user="U_ALICE", channel="C2")))
    assert resp.json()["status"] == "approved"


@pytest.mark.parametrize(
    "values",
    [
        [1],
        {"rule": "x"},
        {"rule": {"rule_choice": [1]}},
        {"rule": {"rule_choice": {"selected_option": {"value": "\u00b2"}}}},
        {"rule": {"rule_choice": {"selected_option": {"value": "9" * 5000}}}},
    ],
    ids=["values-a-list", "block-a-string", "input-a-list", "superscript-digit", "5000-digits"],
)
def test_an_always_submission_of_any_shape_is_answered_in_the_modal(
    client: TestClient, api_broker: Broker, values: Any
) -> None:
    """Slack signs what a modal sends; a state of another shape still gets the modal's answer
    (the error beside the rule), never a 500, and decides nothing."""
    from channels.slack import always_modal as always

    req = make(api_broker)
    submission = {
        "type": "view_submission",
        "user": {"id": "U_ALICE"},
        "view": {
            "callback_id": always.ALWAYS_CALLBACK,
            "private_metadata": f"{req.id} C1",
            "state": {"values": values},
        },
    }
    resp = send(client, *signed(submission))
    assert resp.status_code == 200 and resp.json()["response_action"] == "errors"
    assert api_broker.get_request(req.id).is_pending
