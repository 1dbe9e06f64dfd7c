"""An agent's structured question, answered over each channel, resumes the run as the contract says.

Real agent runs on RQ jobs run in this process (`tests.support.jobs.work`), the API in-process, Slack
as the loopback fake: whichever channel answers (REST, the Slack modal, the email form, a signed
webhook reply), the model reads one line per question and the tool-return part's metadata is
the structured answer. The demo's refunds agent asks its question the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import pytest
import refunds_demo as demo
from fastapi.testclient import TestClient
from pydantic_ai import Agent, CallDeferred, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from redis import Redis
from slack_sdk.signature import SignatureVerifier
from standardwebhooks.webhooks import Webhook

from api.app import create_app
from broker.ask import ask, question
from broker.domain.config import parse_config
from broker.domain.models import Request, RunStatus
from broker.domain.principals import hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.agents import register_agent
from broker.runs.outbox import Resumer
from broker.runs.starting import start_run
from channels.email.links import new_nonce, sign_link
from channels.slack.question_modal import ANSWER_FORM
from tests.support.fakes.harness import SECRET, webhook
from tests.support.fakes.slack import FakeSlack
from tests.support.jobs import jobs_bound_to, work

SIGNING = "signing-secret-for-the-question-fleet"
ADMIN = "admin-token-for-the-question-fleet-test"
ANSWER = {
    "answers": [
        {"question": "Which auth method?", "selected": ["API key"], "other": None},
        {"question": "Which scopes?", "selected": ["read", "admin"], "other": "billing"},
    ]
}
TEXT = "Which auth method? API key\nWhich scopes? read, admin, Other: billing"
SEEN: dict[str, ToolReturnPart] = {}  # the prompt of a run -> the tool return its model read


def _prompt(messages: list[ModelMessage]) -> str:
    first = messages[0]
    assert isinstance(first, ModelRequest)
    return next(str(p.content) for p in first.parts if isinstance(p, UserPromptPart))


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask on the first turn; on the second, record the tool return and say what it read."""
    last = messages[-1]
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if returns:
        SEEN[_prompt(messages)] = returns[0]
        return ModelResponse(parts=[TextPart(f"Noted: {returns[0].model_response_str()}")])
    tool = "raw_question" if "raw" in _prompt(messages) else "choose_auth"
    return ModelResponse(parts=[ToolCallPart(tool, {})])


agent: Agent[None, str | DeferredToolRequests] = Agent(
    FunctionModel(model), output_type=[str, DeferredToolRequests]
)


@agent.tool_plain
def choose_auth() -> str:
    ask(
        [
            question("Which auth method?", "Auth", ["OAuth 2.0", "API key"]),
            question("Which scopes?", "Scopes", ["read", "write", "admin"], multi_select=True),
        ]
    )


@agent.tool_plain
def raw_question() -> str:
    """Skips `broker.ask`'s checks: the broker refuses the request when the round is made."""
    raise CallDeferred(
        metadata={"questions": [{"question": "Which?", "header": "Far too long a header"}]},
        kind="question",
    )


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    fake = FakeSlack().start()
    yield fake
    fake.stop()


@pytest.fixture
def fleet(redis: Redis, slack: FakeSlack) -> Iterator[tuple[Broker, TestClient]]:
    config = parse_config(
        {
            "queues": {
                "default": {"channels": ["inbox", "slack:approvals", "email:leads", "webhook:ops"]}
            },
            "slack": {
                "bot_token": slack.token,
                "signing_secret": SIGNING,
                "api_base_url": slack.url,
                "channels": {"approvals": {"channel": "C1"}},
            },
            "email": {
                "smtp_url": "smtp://127.0.0.1:9",
                "from": "approvals@example.com",
                "public_url": "http://testserver",
                "lists": {"leads": {"to": ["alice@example.com"]}},
            },
            "webhooks": {"ops": webhook("http://127.0.0.1:9/ops")},
            "approvers": {
                "alice": {
                    "token_sha256": hash_token("tok-alice"),
                    "slack_user_id": "U_ALICE",
                    "email": "alice@example.com",
                }
            },
        }
    )
    with jobs_bound_to(Broker(redis, config, prefix="t:")) as broker:
        register_agent(broker, "asker", f"{__name__}:agent")
        demo.register_demo(broker)
        with TestClient(create_app(Settings(admin_token=ADMIN), config, broker)) as client:
            yield broker, client


def waiting_request(broker: Broker, run_id: str) -> Request:
    work(broker)
    run = broker.get_run(run_id)
    assert run.status is RunStatus.waiting, run.error
    [request] = broker.get_requests(run.pending)
    return request


def resume(broker: Broker, run_id: str) -> Any:
    Resumer(broker, consumer="test", min_idle_ms=0, block_ms=None).run_once()
    work(broker)
    run = broker.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    return run.output


# ---- one way to answer per channel -----------------------------------------------------------


def over_rest(client: TestClient, broker: Broker, request: Request) -> None:
    body = {"outcome": "answered", "answer": {"answers": ANSWER["answers"][::-1]}}
    headers = {"Authorization": "Bearer tok-alice"}
    resp = client.post(f"/v1/requests/{request.id}/decision", json=body, headers=headers)
    assert resp.status_code == 200, resp.text


def _slack(client: TestClient, payload: dict[str, Any]) -> dict[str, Any]:
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()))
    signature = SignatureVerifier(SIGNING).generate_signature(timestamp=ts, body=body)
    headers = {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": str(signature),
        "Content-Type": "application/x-www-form-urlencoded",
    }
    resp = client.post("/v1/slack/interactions", content=body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()


def over_slack(client: TestClient, broker: Broker, request: Request, slack: FakeSlack) -> None:
    _slack(
        client,
        {
            "type": "block_actions",
            "user": {"id": "U_ALICE"},
            "channel": {"id": "C1"},
            "trigger_id": "trigger-fleet",
            "actions": [{"action_id": ANSWER_FORM, "value": request.id}],
        },
    )
    view = slack.views[-1]
    values = {
        "q0": {"choice": {"type": "radio_buttons", "selected_option": {"value": "1"}}},
        "q0_other": {"other": {"type": "plain_text_input", "value": None}},
        "q1": {
            "choice": {"type": "checkboxes", "selected_options": [{"value": "0"}, {"value": "2"}]}
        },
        "q1_other": {"other": {"type": "plain_text_input", "value": "billing"}},
    }
    submitted = {
        "type": "view_submission",
        "user": {"id": "U_ALICE"},
        "view": {**view, "state": {"values": values}},
    }
    assert _slack(client, submitted) == {"response_action": "clear"}


def over_email(client: TestClient, broker: Broker, request: Request) -> None:
    url = "/v1/email/" + sign_link(broker, request.id, "alice@example.com", "answer", new_nonce())
    assert 'name="q1_other"' in client.get(url).text
    resp = client.post(url, data={"q0": "1", "q1": ["2", "0"], "q1_other": "billing"})
    assert resp.status_code == 200, resp.text


def over_webhook(client: TestClient, broker: Broker, request: Request) -> None:
    body = json.dumps({"request_id": request.id, "outcome": "answered", "answer": ANSWER})
    now = datetime.now(UTC)
    headers = {
        "webhook-id": f"msg-{request.id}",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(f"msg-{request.id}", now, body),
        "content-type": "application/json",
    }
    resp = client.post("/v1/webhooks/ops/replies", content=body, headers=headers)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("channel", ["rest", "slack", "email", "webhook"])
def test_an_agents_question_answered_over_each_channel_resumes_with_text_and_metadata(
    fleet: tuple[Broker, TestClient], slack: FakeSlack, channel: str
) -> None:
    broker, client = fleet
    prompt = f"set up auth (answered over {channel})"
    run = start_run(broker, "asker", prompt)
    request = waiting_request(broker, run.id)
    assert request.kind == "question"
    assert [q["header"] for q in request.metadata["questions"]] == ["Auth", "Scopes"]

    if channel == "rest":
        over_rest(client, broker, request)
    elif channel == "slack":
        over_slack(client, broker, request, slack)
    elif channel == "email":
        over_email(client, broker, request)
    else:
        over_webhook(client, broker, request)

    assert broker.get_request(request.id).decision.answer == ANSWER  # type: ignore[union-attr]
    assert resume(broker, run.id) == f"Noted: {TEXT}"
    part = SEEN[prompt]
    assert part.content == TEXT  # what the model reads
    assert part.metadata == ANSWER  # what the program reads; never sent to the model
    assert "selected" not in part.model_response_str()


def test_a_question_the_broker_refuses_fails_the_run_with_its_message_and_asks_nothing(
    fleet: tuple[Broker, TestClient],
) -> None:
    broker, _ = fleet
    run = start_run(broker, "asker", "a raw question")
    work(broker)
    failed = broker.get_run(run.id)
    assert failed.status is RunStatus.failed
    assert failed.error == "metadata.questions[0].header: at most 12 characters"
    assert broker.list_requests() == []


def test_the_demo_asks_card_or_store_credit_for_a_split_payment_and_refunds_as_answered(
    fleet: tuple[Broker, TestClient],
) -> None:
    broker, client = fleet
    run = start_run(broker, demo.AGENT_NAME, "Refund order A105 because the strap broke.")
    request = waiting_request(broker, run.id)
    [q] = request.metadata["questions"]
    assert q["question"] == "Refund order A105 to the card or as store credit?"
    assert [o["label"] for o in q["options"]] == ["Card", "Store credit"]
    answer = {"answers": [{"question": q["question"], "selected": ["Store credit"]}]}
    headers = {"Authorization": "Bearer tok-alice"}
    url = f"/v1/requests/{request.id}/decision"
    wrong = {"answers": [{"question": q["question"], "selected": ["Cash"]}]}
    bad = client.post(url, json={"outcome": "answered", "answer": wrong}, headers=headers)
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_answer"
    ok = client.post(url, json={"outcome": "answered", "answer": answer}, headers=headers)
    assert ok.status_code == 200, ok.text

    output = resume(broker, run.id)
    assert output["refunded"] is True and output["amount"] == 45
    (refund,) = demo.Ledger(broker.redis, broker.keys.prefix).for_run(run.id)
    assert refund.reason == "the strap broke; refund to: Store credit"

    # a customer who says how is not asked
    prompt = "Refund order A105 as store credit because it broke."
    said = start_run(broker, demo.AGENT_NAME, prompt, deps={"customer": "c-9"})
    work(broker)
    done = broker.get_run(said.id)
    assert done.status is RunStatus.finished and done.output["refunded"] is True, done.error
    assert [r.id for r in broker.list_requests()] == [request.id]
