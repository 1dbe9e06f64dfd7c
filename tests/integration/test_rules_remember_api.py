"""A decision that remembers, over HTTP and in the shell: `remember` on
POST /v1/requests/{id}/decision and `approval-broker decide ID approve --remember N`, the
status codes (403 for a rule wider than its creator may decide, 422 for other outcomes), and
the rule figures on /metrics."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from approval_broker.cli import app as cli_app
from broker.domain.models import Status
from broker.facade import Broker
from tests.support.auth import bearer, person  # noqa: F401
from tests.support.remember import ALICE, PAT, RAW, round_of  # noqa: F401

runner = CliRunner()


API_CONFIG = RAW


def test_rest_decision_with_remember_keeps_the_rule_and_decides_the_sibling(
    client, api_broker: Broker
) -> None:
    run_id, (a, b) = round_of(api_broker)
    res = client.post(
        f"/v1/requests/{a.id}/decision", json={"outcome": "approved", "remember": 0}, headers=ALICE
    )
    assert res.status_code == 200, res.text
    assert res.json()["status"] == "approved"
    [rule] = client.get("/v1/rules", headers=ALICE).json()
    assert rule["run_id"] == run_id and rule["created_by"] == "alice" and rule["hits"] == 1
    assert rule["from_request"] == a.id
    sibling = client.get(f"/v1/requests/{b.id}", headers=ALICE).json()
    assert sibling["decision"]["rule"] == rule["id"]
    assert sibling["decision"]["decided_by"] == f"rule:{rule['id']}"
    text = client.get("/metrics").text
    assert f'approval_broker_rule_decisions_total{{effect="allow",rule="{rule["id"]}"}} 1.0' in text
    assert "approval_broker_rules 1.0" in text


def test_rest_remember_refusals_write_nothing(client, api_broker: Broker) -> None:
    _, (a, _) = round_of(api_broker)
    url = f"/v1/requests/{a.id}/decision"
    wide = client.post(
        url, json={"outcome": "approved", "remember": {"tool": "refund"}}, headers=ALICE
    )
    assert wide.status_code == 403 and wide.json()["error"] == "forbidden"
    assert "scoped to a run_id or an agent" in wide.json()["detail"]
    other = client.post(url, json={"outcome": "escalated", "remember": 0}, headers=ALICE)
    assert other.status_code == 422 and other.json()["error"] == "invalid_rule"
    bad = client.post(
        url,
        json={"outcome": "approved", "remember": {"tool": "", "run_id": "r"}},
        headers=ALICE,
    )
    assert bad.status_code == 422 and bad.json()["detail"].startswith("remember.tool:")
    assert client.get("/v1/rules", headers=PAT).json() == []
    assert api_broker.get_request(a.id).status is Status.pending
    # role policy may remember the tool everywhere
    ok = client.post(url, json={"outcome": "approved", "remember": {"tool": "refund"}}, headers=PAT)
    assert ok.status_code == 200, ok.text
    [rule] = client.get("/v1/rules", headers=PAT).json()
    assert rule["creator_roles"] is None and rule["run_id"] is None


@pytest.fixture
def env(redis_url: str, tmp_config, monkeypatch) -> None:
    path = tmp_config('[queues.default]\n[agents.refunds]\npath = "refunds_demo:agent"\n')
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("APPROVAL_BROKER_CONFIG", str(path))
    monkeypatch.setenv("APPROVAL_BROKER_KEY_PREFIX", "t:")


def test_cli_decide_remember(env, api_broker: Broker) -> None:
    _, (a, b) = round_of(api_broker)
    out = runner.invoke(cli_app, ["decide", a.id, "approve", "--remember", "1", "--by", "ops"])
    assert out.exit_code == 0, out.output
    assert "kept" in out.stdout and b.id in out.stdout and f"{a.id}: approved" in out.stdout
    [rule] = api_broker.requests.rules.list()
    assert rule.agent == "refunds" and rule.created_by == "ops"
    assert api_broker.get_request(b.id).status is Status.approved
    _, (later, _) = round_of(api_broker)  # the agent's rule decides it at create
    assert later.decision is not None and later.decision.rule == rule.id
    _, (c, _) = round_of(api_broker, tool="ship")
    bad = runner.invoke(cli_app, ["decide", c.id, "approve", "--remember", "9"])
    assert bad.exit_code != 0 and "suggested rules" in bad.output
    assert "Traceback" not in bad.output
    assert api_broker.get_request(c.id).status is Status.pending
