"""Structured questions on every channel: bad questions are refused at create, and every reply
path (REST, the Slack modal, the email form, signed webhook replies) refuses an answer that
doesn't fit before it counts, leaving the request pending for the next valid reply.

Slack is the loopback fake (views.open, chat.update), mail goes through a real SMTP sink, and
the notifier runs for real, so the Slack message and the mails are what a person would see.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from slack_sdk.signature import SignatureVerifier
from standardwebhooks.webhooks import Webhook

from api.app import create_app
from broker.ask import question
from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest, Request, Status
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.email.links import read_link
from channels.slack.question_modal import ANSWER_FORM, ANSWER_FORM_CALLBACK
from tests.support.fakes.harness import SECRET, running, webhook
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.smtp import SmtpSink
from tests.support.fakes.webhook_receiver import WebhookReceiver
from tests.support.notifier_setup import email_section, slack_section
from tests.support.waiting import wait_for

SIGNING = "signing-secret-for-question-tests"
ADMIN = "admin-token-for-question-channel-tests"
PUBLIC = "http://testserver"
AUTH = question(
    "Which auth method?",
    "Auth",
    [
        {"label": "OAuth 2.0", "description": "users sign in", "preview": "Authorization: Bearer"},
        {"label": "API key"},
    ],
)
SCOPES = question("Which scopes?", "Scopes", ["read", "write", "admin"], multi_select=True)
TICKET = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "title": "Title", "description": "One line"},
        "hours": {"type": "number", "title": "Hours", "minimum": 0},
        "priority": {"enum": ["low", "high"], "default": "low", "title": "Priority"},
        "urgent": {"type": "boolean", "title": "Urgent"},
    },
    "required": ["title"],
}


def channels_config(slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver) -> Config:
    return parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox", "slack:approvals", "email:leads", "webhook:ops"]}
            },
            "slack": slack_section(slack, signing_secret=SIGNING),
            "email": email_section(
                smtp, public_url=PUBLIC, lists={"leads": {"to": ["alice@example.com"]}}
            ),
            "webhooks": {"ops": webhook(receiver.url("/ops"))},
            "approvers": {
                "alice": {
                    "token_sha256": hash_token("tok-alice"),
                    "slack_user_id": "U_ALICE",
                    "email": "alice@example.com",
                }
            },
        }
    )


@pytest.fixture(name="cfg")
def cfg_on_the_fake_channels(slack: FakeSlack, smtp: SmtpSink, receiver: WebhookReceiver) -> Config:
    return channels_config(slack, smtp, receiver)


@pytest.fixture
def api(api_broker: Broker, cfg: Config) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(admin_token=ADMIN), cfg, api_broker)) as client:
        yield client


def ask(broker: Broker, metadata: dict[str, Any]) -> Request:
    return broker.create_request(
        NewRequest(tool_name="choose", kind="question", prompt="Pick, please", metadata=metadata)
    )


def alice() -> dict[str, str]:
    return {"Authorization": "Bearer tok-alice"}


# ---- create --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            {"kind": "question", "metadata": {"questions": [{**AUTH, "header": "A header too long"}]}},
            "metadata.questions[0].header: at most 12 characters",
        ),
        (
            {"kind": "question", "metadata": {"questions": [{**AUTH, "options": [AUTH["options"][0]]}]}},
            "metadata.questions[0].options: at least 2 items",
        ),
        (
            {"kind": "approval", "metadata": {"questions": [AUTH]}},
            "metadata.questions: only a question request may carry questions",
        ),
        (
            {"kind": "question", "metadata": {"answer_schema": {"type": "object", "properties": {"x": {"type": "object"}}}}},
            "metadata.answer_schema.properties.x: unsupported type 'object'",
        ),
    ],
)  # fmt: skip
def test_a_malformed_question_is_422_naming_the_field_and_nothing_is_created(
    api: TestClient, api_broker: Broker, body: dict[str, Any], detail: str
) -> None:
    resp = api.post(
        "/v1/requests",
        json={"tool_name": "choose", **body},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"] == "invalid_question"
    assert resp.json()["detail"].startswith(detail), resp.json()["detail"]
    assert api_broker.list_requests() == []
    assert api_broker.counts() == {}
    assert api_broker.redis.xlen(api_broker.keys.stream("default")) == 0  # nothing announced


# ---- REST ----------------------------------------------------------------------------------


def test_rest_refuses_an_answer_that_does_not_fit_and_the_next_valid_one_wins(
    api: TestClient, api_broker: Broker
) -> None:
    req = ask(api_broker, {"questions": [AUTH, SCOPES]})
    url = f"/v1/requests/{req.id}/decision"
    wrong = {
        "outcome": "answered",
        "answer": {
            "answers": [
                {"question": "Which auth method?", "selected": ["Basic"], "other": None},
                {"question": "Which scopes?", "selected": ["read"], "other": None},
            ]
        },
    }
    resp = api.post(url, json=wrong, headers=alice())
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"] == "invalid_answer"
    assert "'Basic' is not an option of 'Which auth method?'" in resp.json()["detail"]
    assert api_broker.get_request(req.id).is_pending
    right = {
        "outcome": "answered",
        "answer": {
            "answers": [  # out of order, labels out of order, a blank "other": normalised
                {"question": "Which scopes?", "selected": ["write", "read"], "other": "  "},
                {"question": "Which auth method?", "selected": [], "other": "SAML"},
            ]
        },
    }
    resp = api.post(url, json=right, headers=alice())
    assert resp.status_code == 200, resp.text
    assert resp.json()["decision"]["answer"] == {
        "answers": [
            {"question": "Which auth method?", "selected": [], "other": "SAML"},
            {"question": "Which scopes?", "selected": ["read", "write"], "other": None},
        ]
    }
    again = api.post(url, json=right, headers=alice())  # the same person repeating: harmless
    assert again.status_code == 200, again.text


# ---- Slack ---------------------------------------------------------------------------------

_clicks = iter(range(1_000_000))


def slack_post(api: TestClient, payload: dict[str, Any]) -> Any:
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()))
    signature = SignatureVerifier(SIGNING).generate_signature(timestamp=ts, body=body)
    assert signature is not None
    headers = {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }
    return api.post("/v1/slack/interactions", content=body, headers=headers)


def click_answer(request_id: str, user: str = "U_ALICE") -> dict[str, Any]:
    return {
        "type": "block_actions",
        "user": {"id": user},
        "channel": {"id": "C1"},
        "trigger_id": f"trigger-{next(_clicks)}",
        "actions": [{"action_id": ANSWER_FORM, "value": request_id, "type": "button"}],
    }


def submission(view: dict[str, Any], values: dict[str, Any], user: str = "U_ALICE") -> dict:
    return {
        "type": "view_submission",
        "user": {"id": user},
        "view": {
            "id": view["id"],
            "callback_id": view["callback_id"],
            "private_metadata": view["private_metadata"],
            "state": {"values": values},
        },
    }


def radio(value: str | None) -> dict[str, Any]:
    chosen = {"value": value, "text": {"type": "plain_text", "text": "?"}} if value else None
    return {"choice": {"type": "radio_buttons", "selected_option": chosen}}


def boxes(*values: str) -> dict[str, Any]:
    return {"choice": {"type": "checkboxes", "selected_options": [{"value": v} for v in values]}}


def text(value: str | None, action_id: str = "other") -> dict[str, Any]:
    return {action_id: {"type": "plain_text_input", "value": value}}


def test_slack_answer_opens_the_modal_refuses_a_bad_submission_and_updates_the_message(
    api: TestClient, api_broker: Broker, slack: FakeSlack
) -> None:
    with running(api_broker):
        req = ask(api_broker, {"questions": [AUTH, SCOPES]})
        posted = wait_for(lambda: slack.message_for(req.id))
        buttons = [e for b in posted["blocks"] if b["type"] == "actions" for e in b["elements"]]
        assert [b["action_id"] for b in buttons][:1] == [ANSWER_FORM]

        click = click_answer(req.id)
        resp = slack_post(api, click)
        assert resp.status_code == 200 and resp.json()["status"] == "pending", resp.text
        (view,) = slack.views
        assert view["trigger_id"] == click["trigger_id"]  # opened with the click's trigger
        assert view["callback_id"] == ANSWER_FORM_CALLBACK
        assert view["private_metadata"] == f"{req.id} C1"  # the request and the click's channel
        inputs = {b["block_id"]: b for b in view["blocks"] if b["type"] == "input"}
        assert list(inputs) == ["q0", "q0_other", "q1", "q1_other"]
        assert inputs["q0"]["element"]["type"] == "radio_buttons"
        assert inputs["q1"]["element"]["type"] == "checkboxes"
        assert [o["value"] for o in inputs["q0"]["element"]["options"]] == ["0", "1"]
        assert inputs["q0"]["element"]["options"][0]["description"]["text"] == "users sign in"
        assert any(
            "Authorization: Bearer" in b.get("text", {}).get("text", "") for b in view["blocks"]
        )

        # an option *and* own words on a single-choice question: refused beside that input
        bad = {"q0": radio("1"), "q0_other": text("SAML"), "q1": boxes("0"), "q1_other": text(None)}
        resp = slack_post(api, submission(view, bad))
        assert resp.status_code == 200, resp.text
        assert resp.json()["response_action"] == "errors"
        assert set(resp.json()["errors"]) == {"q0"}
        assert "takes one choice" in resp.json()["errors"]["q0"]
        # nothing answered: the second question left empty is refused too
        resp = slack_post(
            api, submission(view, {"q0": radio("0"), "q1": boxes(), "q1_other": text(None)})
        )
        assert resp.json()["response_action"] == "errors" and "q1" in resp.json()["errors"]
        assert api_broker.get_request(req.id).is_pending

        good = {
            "q0": radio("0"),
            "q0_other": text(None),
            "q1": boxes("2", "0"),
            "q1_other": text("billing"),
        }
        resp = slack_post(api, submission(view, good))
        assert resp.status_code == 200 and resp.json() == {"response_action": "clear"}, resp.text
        stored = api_broker.get_request(req.id)
        assert stored.status is Status.answered and stored.decision is not None
        assert stored.decision.decided_by == "alice"
        assert stored.decision.answer == {
            "answers": [
                {"question": "Which auth method?", "selected": ["OAuth 2.0"], "other": None},
                {"question": "Which scopes?", "selected": ["read", "admin"], "other": "billing"},
            ]
        }

        def updated() -> str | None:
            message = slack.message_for(req.id)
            shown = (
                json.dumps(message["blocks"]) if message and slack.calls_to("chat.update") else ""
            )
            return shown if "Answered" in shown else None

        shown = wait_for(updated)
        assert "Which auth method? OAuth 2.0" in shown
        assert "Which scopes? read, admin, Other: billing" in shown
        assert ANSWER_FORM not in shown  # the button is gone
    # a later, different submission of the same modal is told who won, in the modal
    late = {**good, "q0": radio("1")}
    resp = slack_post(api, submission(view, late))
    assert resp.json()["response_action"] == "errors" and resp.json()["error"] == "conflict"
    assert "already answered by alice" in resp.json()["errors"]["q0"]


def test_slack_schema_modal_answers_with_typed_values_and_defaults(
    api: TestClient, api_broker: Broker, slack: FakeSlack
) -> None:
    req = ask(api_broker, {"answer_schema": TICKET})
    assert slack_post(api, click_answer(req.id)).status_code == 200
    (view,) = slack.views
    inputs = {b["block_id"]: b for b in view["blocks"] if b["type"] == "input"}
    assert list(inputs) == ["field:title", "field:hours", "field:priority", "field:urgent"]
    assert inputs["field:hours"]["element"]["type"] == "number_input"
    assert inputs["field:priority"]["element"]["initial_option"]["value"] == "0"  # the default
    assert inputs["field:title"]["hint"]["text"] == "One line"

    resp = slack_post(
        api,
        submission(view, {"field:title": text(None, "value"), "field:hours": text("-1", "value")}),
    )
    assert resp.json()["response_action"] == "errors"
    assert set(resp.json()["errors"]) == {"field:title", "field:hours"}
    assert api_broker.get_request(req.id).is_pending

    values = {
        "field:title": text("Login fails", "value"),
        "field:hours": text("2.5", "value"),
        "field:urgent": {"value": {"type": "radio_buttons", "selected_option": {"value": "true"}}},
    }
    assert slack_post(api, submission(view, values)).json() == {"response_action": "clear"}
    answer = api_broker.get_request(req.id).decision.answer  # type: ignore[union-attr]
    assert answer == {"title": "Login fails", "hours": 2.5, "urgent": True, "priority": "low"}


def test_slack_answer_button_checks_the_decider_before_opening_anything(
    api: TestClient, api_broker: Broker, slack: FakeSlack
) -> None:
    req = ask(api_broker, {"questions": [AUTH]})
    resp = slack_post(api, click_answer(req.id, user="U_STRANGER"))
    assert resp.status_code == 200 and resp.json()["error"] == "forbidden", resp.text
    assert slack.views == []
    plain = api_broker.create_request(NewRequest(tool_name="ask", kind="question"))
    resp = slack_post(api, click_answer(plain.id))
    assert resp.json()["error"] == "invalid" and slack.views == []


# ---- email ---------------------------------------------------------------------------------


def answer_link(broker: Broker, smtp: SmtpSink, request_id: str) -> str:
    def found() -> str | None:
        for mail in smtp.mails:
            for token in re.findall(
                re.escape(PUBLIC) + r"/v1/email/([\w.\-]+)", mail.part("plain")
            ):
                claims = read_link(broker, token, 3600)
                if claims.request_id == request_id and claims.action == "answer":
                    return "/v1/email/" + token
        return None

    return wait_for(found)


def test_email_form_shows_the_schema_refuses_a_bad_post_with_the_form_and_decides_on_a_good_one(
    api: TestClient, api_broker: Broker, smtp: SmtpSink
) -> None:
    with running(api_broker):
        req = ask(api_broker, {"answer_schema": TICKET})
        url = answer_link(api_broker, smtp, req.id)
    page = api.get(url)
    assert page.status_code == 200, page.text
    html = page.text
    assert 'name="field:title"' in html and "One line" in html
    assert 'type="number" name="field:hours" step="any" min="0"' in html
    assert '<option value="0" selected>low</option>' in html  # the default, preselected
    assert 'name="field:urgent" value="true"' in html
    assert api_broker.get_request(req.id).is_pending  # GET decides nothing

    bad = api.post(url, data={"field:title": "", "field:hours": "-2", "field:priority": "1"})
    assert bad.status_code == 422, bad.text
    assert 'data-for="field:title"' in bad.text and 'data-for="field:hours"' in bad.text
    assert '<option value="1" selected>high</option>' in bad.text  # as the person sent it
    assert api_broker.get_request(req.id).is_pending
    nonsense = api.post(url, data={"field:title": "x", "field:hours": "lots"})
    assert nonsense.status_code == 422 and "is not a number" in nonsense.text

    good = api.post(
        url, data={"field:title": "Login fails", "field:hours": "3", "field:urgent": "false"}
    )
    assert good.status_code == 200, good.text
    assert "Title: Login fails" in good.text
    stored = api_broker.get_request(req.id)
    assert stored.status is Status.answered and stored.decision is not None
    assert stored.decision.decided_by == "alice"
    assert stored.decision.answer == {
        "title": "Login fails",
        "hours": 3,
        "urgent": False,
        "priority": "low",
    }
    assert api.post(url, data={"field:title": "again"}).status_code == 410  # the link is spent


def test_email_form_shows_the_questions_and_answers_them(
    api: TestClient, api_broker: Broker, smtp: SmtpSink
) -> None:
    with running(api_broker):
        req = ask(api_broker, {"questions": [AUTH, SCOPES]})
        url = answer_link(api_broker, smtp, req.id)
    html = api.get(url).text
    assert (
        'type="radio" name="q0" value="0"' in html and 'type="checkbox" name="q1" value="2"' in html
    )
    assert 'name="q0_other"' in html and '<pre class="preview">Authorization: Bearer</pre>' in html
    bad = api.post(url, data={"q0": "0", "q1": "9"})
    assert bad.status_code == 422 and 'data-for="q1"' in bad.text
    assert 'name="q0" value="0" checked' in bad.text  # kept as sent
    good = api.post(url, data={"q0_other": "SAML", "q1": ["0", "1"]})
    assert good.status_code == 200, good.text
    assert api_broker.get_request(req.id).decision.answer == {  # type: ignore[union-attr]
        "answers": [
            {"question": "Which auth method?", "selected": [], "other": "SAML"},
            {"question": "Which scopes?", "selected": ["read", "write"], "other": None},
        ]
    }


# ---- webhooks ------------------------------------------------------------------------------


def reply(api: TestClient, body: dict[str, Any], msg_id: str) -> Any:
    raw = json.dumps(body)
    now = time.time()
    from datetime import UTC, datetime

    when = datetime.fromtimestamp(now, UTC)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now)),
        "webhook-signature": Webhook(SECRET).sign(msg_id, when, raw),
        "content-type": "application/json",
    }
    return api.post("/v1/webhooks/ops/replies", content=raw, headers=headers)


def test_a_signed_webhook_reply_that_does_not_fit_is_422_and_a_valid_one_wins_after_it(
    api: TestClient, api_broker: Broker, receiver: WebhookReceiver
) -> None:
    with running(api_broker):
        req = ask(api_broker, {"answer_schema": TICKET})
        (delivery,) = wait_for(lambda: receiver.accepted("/ops"))
    assert delivery.verified and delivery.payload["type"] == "approval.requested"
    assert delivery.payload["data"]["metadata"] == {"answer_schema": TICKET}  # the questions
    body = {"request_id": req.id, "outcome": "answered", "decided_by": "jane"}
    resp = reply(api, {**body, "answer": {"hours": "three"}}, "msg-bad")
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"] == "invalid_answer"
    assert "'title' is a required property" in resp.json()["detail"]
    assert api_broker.get_request(req.id).is_pending
    resp = reply(api, {**body, "answer": {"title": "Disk full"}}, "msg-good")
    assert resp.status_code == 200, resp.text
    assert resp.json()["decision"]["answer"] == {"title": "Disk full", "priority": "low"}
    assert resp.json()["decision"]["decided_by"] == "webhook:ops/jane"
