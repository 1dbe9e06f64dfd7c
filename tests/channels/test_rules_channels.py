"""Remembering through the person-facing channels, on a real Redis: Slack's "Always…" button
opens a modal of the suggested rules whose submission decides and keeps the rule, and the mail
carries "Approve, and the same for the rest of this run", whose link does the same."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient
from redis import Redis

from api.app import create_app
from broker.domain.config import Config, parse_config
from broker.domain.models import NewRequest, Status
from broker.domain.settings import Settings
from broker.facade import Broker
from channels.email.links import read_link
from channels.slack import always_modal as always
from channels.slack.blocks import action_blocks
from tests.support.fakes.harness import running
from tests.support.fakes.smtp import SmtpSink
from tests.support.slack_api import click, send, signed, slack_cfg  # noqa: F401
from tests.support.waiting import wait_for


def run_round(broker: Broker, n: int = 2) -> tuple[str, list]:
    run_id = broker.create_run("refunds", "p").id
    calls = [NewRequest(tool_name="refund", args={"amount": 10 * (i + 1)}) for i in range(n)]
    return run_id, broker.create_round(run_id, 1, calls)


def buttons(blocks: list[dict[str, Any]]) -> list[str]:
    return [e["action_id"] for b in blocks if b["type"] == "actions" for e in b["elements"]]


def test_slack_offers_always_on_a_runs_approvals_only(api_broker: Broker, cfg: Config) -> None:  # noqa: F811
    _, (a, _) = run_round(api_broker)
    alone = api_broker.create_request(NewRequest(tool_name="refund"))
    assert buttons(action_blocks(a, cfg)) == ["approve", "always", "reject", "escalate"]
    assert buttons(action_blocks(alone, cfg)) == ["approve", "reject", "escalate"]


def submit_always(
    request_id: str, index: str, outcome: str, user: str = "U_ALICE", mode: str | None = None
) -> dict:
    chosen_mode = {always.MODE_BLOCK: {always.MODE_ACTION: {"selected_option": {"value": mode}}}}
    return {
        "type": "view_submission",
        "user": {"id": user},
        "view": {
            "callback_id": always.ALWAYS_CALLBACK,
            "private_metadata": f"{request_id} C1",
            "state": {
                "values": {
                    always.RULE_BLOCK: {always.RULE_ACTION: {"selected_option": {"value": index}}},
                    always.OUTCOME_BLOCK: {
                        always.OUTCOME_ACTION: {"selected_option": {"value": outcome}}
                    },
                    always.REASON_BLOCK: {always.REASON_ACTION: {"value": None}},
                    **(chosen_mode if mode else {}),
                }
            },
        },
    }


def test_slack_always_opens_the_modal_and_its_submission_keeps_the_rule(
    client: TestClient,
    api_broker: Broker,
    fake_slack,  # noqa: F811
) -> None:
    run_id, (a, b) = run_round(api_broker)
    resp = send(client, *signed(click(always.ALWAYS, a.id)))
    assert resp.status_code == 200 and resp.json()["status"] == "pending"
    (opened,) = [body for path, body in fake_slack.calls if path == "/api/views.open"]
    view = opened["view"]
    assert view["callback_id"] == always.ALWAYS_CALLBACK
    assert view["private_metadata"] == f"{a.id} C1"
    options = view["blocks"][0]["element"]["options"]
    assert [o["text"]["text"] for o in options][:2] == [
        "refund in this run",
        "refund for agent refunds",
    ]
    assert api_broker.get_request(a.id).is_pending  # opening decides nothing
    # bob lacks nothing here, but an unknown Slack user is refused inside the modal
    refused = send(client, *signed(submit_always(a.id, "0", "approved", user="U_NOBODY")))
    assert refused.json()["response_action"] == "errors"
    assert api_broker.get_request(a.id).is_pending
    done = send(client, *signed(submit_always(a.id, "0", "approved")))
    assert done.status_code == 200 and done.json() == {"response_action": "clear"}
    [rule] = api_broker.requests.rules.list()
    assert rule.run_id == run_id and rule.created_by == "alice"
    assert [r.status for r in api_broker.get_requests([a.id, b.id])] == [Status.approved] * 2
    assert api_broker.get_request(b.id).decision.rule == rule.id


def test_slack_always_can_try_the_rule_in_shadow_first(
    client: TestClient,
    api_broker: Broker,
    fake_slack,  # noqa: F811
) -> None:
    _, (a, b) = run_round(api_broker)
    send(client, *signed(click(always.ALWAYS, a.id)))
    (opened,) = [body for path, body in fake_slack.calls if path == "/api/views.open"]
    modes = [blk for blk in opened["view"]["blocks"] if blk["block_id"] == always.MODE_BLOCK]
    assert [o["value"] for o in modes[0]["element"]["options"]] == ["enforce", always.SHADOW]
    done = send(client, *signed(submit_always(a.id, "0", "approved", mode=always.SHADOW)))
    assert done.json() == {"response_action": "clear"}
    [rule] = api_broker.requests.rules.list()
    assert rule.mode == "shadow"
    assert api_broker.get_request(a.id).status is Status.approved  # the decision itself: made
    assert api_broker.get_request(b.id).is_pending  # the rule decides nothing, even siblings


PUBLIC = "http://testserver"


def test_the_mail_link_approves_and_keeps_the_same_for_the_rest_of_the_run(
    redis: Redis, smtp: SmtpSink
) -> None:
    config = parse_config(
        {
            "queues": {"default": {"channels": ["email:leads"]}},
            "email": {
                "smtp_url": smtp.url,
                "from": "approvals@example.com",
                "public_url": PUBLIC,
                "lists": {"leads": {"to": ["alice@example.com"]}},
            },
            "approvers": {"alice": {"roles": ["finance"], "email": "alice@example.com"}},
        }
    )
    broker = Broker(redis, config, prefix="t:")
    with running(broker):
        run_id, (a, b) = run_round(broker)
        wait_for(lambda: len(smtp.mails) == 2)
    mail = next(m for m in smtp.mails if a.id in m.part("plain"))
    plain = mail.part("plain")
    assert "Approve, and the same for the rest of this run" in plain
    tokens = re.findall(re.escape(PUBLIC) + r"/v1/email/([A-Za-z0-9_.\-]+)", plain)
    [token] = [t for t in tokens if read_link(broker, t, 3600).action == "approve_run"]
    with TestClient(create_app(Settings(), config, broker)) as client:
        page = client.get(f"/v1/email/{token}")
        assert page.status_code == 200 and "the same for the rest of this run" in page.text
        assert broker.get_request(a.id).is_pending
        done = client.post(f"/v1/email/{token}", data={"args_hash": a.args_hash})
        assert done.status_code == 200, done.text
        again = client.post(f"/v1/email/{token}", data={"args_hash": a.args_hash})
        assert again.status_code == 410  # the link is spent with the decision
    [rule] = broker.requests.rules.list()
    assert rule.run_id == run_id and rule.created_by == "alice" and rule.from_request == a.id
    assert [r.status for r in broker.get_requests([a.id, b.id])] == [Status.approved] * 2
