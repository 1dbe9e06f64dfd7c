"""Rules in shadow: a rule with `mode = "shadow"` (from the config, the API or a remember's
"try this rule") decides nothing; each request it would have decided records `shadow_rule`
(history, audit trail, the event `approval.shadow_rule` on its queue's stream, /metrics); `approval-broker rules replay` reports what shadow rules
would have decided against what people decided."""

from __future__ import annotations

from redis import Redis
from typer.testing import CliRunner

from approval_broker.cli import app as cli_app
from broker.audit import AuditTrail
from broker.domain.config import Config
from broker.domain.models import Decision, NewRequest, Status
from broker.facade import Broker
from broker.store.rule_sync import sync_at_start
from tests.support.auth import person

RAW = {
    "queues": {"default": {"channels": ["inbox"]}},
    "agents": {"refunds": {"path": "refunds_demo:agent"}},
    "approvers": {
        "pat": person("tok-pat", ["policy"]),
        "alice": person("tok-alice", ["finance"]),
    },
    "rules": [
        {
            "id": "small",
            "effect": "allow",
            "tool": "refund",
            "mode": "shadow",
            "args": {"amount": {"le": 10}},
        },
    ],  # fmt: skip
}
PAT, ALICE = {"Authorization": "Bearer tok-pat"}, {"Authorization": "Bearer tok-alice"}


API_CONFIG = RAW


def shadow_broker(redis: Redis, cfg: Config) -> Broker:
    broker = Broker(redis, cfg, prefix="t:")
    sync_at_start(broker.requests.rules)
    return broker


def test_a_shadow_rule_decides_nothing_and_records_what_it_would_have(redis, cfg) -> None:
    broker = shadow_broker(redis, cfg)
    small = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    large = broker.create_request(NewRequest(tool_name="refund", args={"amount": 50}))
    assert broker.get_request(small.id).status is Status.pending  # decided by nothing
    history = broker.get_request(small.id).history
    assert [(h.event, h.rule, h.detail) for h in history] == [
        ("shadow_rule", "small", "would allow")
    ]
    assert broker.get_request(large.id).history == []
    shadow = [e for e in AuditTrail(redis, broker.keys).entries() if e.event == "shadow_rule"]
    assert [(e.request_id, e.actor, e.actor_kind, e.outcome) for e in shadow] == [
        (small.id, "rule:small", "rule", "allow")
    ]
    assert redis.hget(broker.keys.rules.hits, "shadow:allow:small") == b"1"
    assert broker.requests.rules.get("small").hits == 0
    events = [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in redis.xrange(broker.keys.stream("default"))
    ]
    shadowed = [e for e in events if e["type"] == "approval.shadow_rule"]
    assert [(e["request_id"], e["rule"], e["effect"]) for e in shadowed] == [
        (small.id, "small", "allow")
    ]


def test_shadow_matches_are_a_metric(client, api_broker: Broker) -> None:
    sync_at_start(api_broker.requests.rules)
    api_broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    text = client.get("/metrics").text
    assert 'approval_broker_rule_shadow_matches_total{effect="allow",rule="small"} 1.0' in text


def test_a_shadow_rule_made_over_the_api_decides_nothing(client, api_broker: Broker) -> None:
    made = client.post(
        "/v1/rules", json={"id": "wipes", "effect": "deny", "tool": "wipe", "mode": "shadow"},
        headers=PAT,
    )  # fmt: skip
    assert made.status_code == 201 and made.json()["mode"] == "shadow"
    req = api_broker.create_request(NewRequest(tool_name="wipe", args={}))
    assert api_broker.get_request(req.id).status is Status.pending
    bad = client.post(
        "/v1/rules", json={"effect": "deny", "tool": "wipe", "mode": "maybe"}, headers=PAT
    )
    assert bad.status_code == 422 and bad.json()["detail"].startswith("mode:")


def test_try_this_rule_keeps_a_suggested_rule_in_shadow(client, api_broker: Broker) -> None:
    run_id = api_broker.create_run("refunds", "p").id
    one, two = api_broker.create_round(
        run_id, 1, [NewRequest(tool_name="issue", args={"n": n}) for n in (1, 2)]
    )
    index = next(i for i, r in enumerate(one.suggested_rules) if r.get("run_id"))
    done = client.post(
        f"/v1/requests/{one.id}/decision",
        json={"outcome": "approved", "remember": {"suggested": index, "mode": "shadow"}},
        headers=ALICE,
    )
    assert done.status_code == 200, done.text
    rules = [r for r in api_broker.requests.rules.list() if r.from_request == one.id]
    assert [r.mode for r in rules] == ["shadow"]
    assert api_broker.get_request(two.id).status is Status.pending  # the sibling: not decided


def test_replay_reports_agreements_and_disagreements(redis, redis_url, cfg, tmp_config) -> None:
    broker = shadow_broker(redis, cfg)
    agreed = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    refused = broker.create_request(NewRequest(tool_name="refund", args={"amount": 7}))
    broker.create_request(NewRequest(tool_name="refund", args={"amount": 9}))  # still pending
    other = broker.create_request(NewRequest(tool_name="refund", args={"amount": 70}))
    broker.decide(agreed.id, Decision(outcome="approved"), decided_by="alice")
    broker.decide(refused.id, Decision(outcome="rejected", reason="no"), decided_by="alice")
    broker.decide(other.id, Decision(outcome="rejected", reason="no"), decided_by="alice")
    env = {
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_KEY_PREFIX": "t:",
        "APPROVAL_BROKER_CONFIG": str(tmp_config(CONFIG_TOML)),
    }
    out = CliRunner().invoke(cli_app, ["rules", "replay", "--since", "2000-01-01"], env=env)
    assert out.exit_code == 0, out.output
    assert "4 approval requests created since" in out.output
    assert (
        "small (shadow)  allow refund: would decide 3; agreements 1, disagreements 1,"
        " undecided 1, unknown 0" in out.output
    )
    assert f"disagrees: {refused.id} was rejected by alice" in out.output
    rules_file = tmp_config('[[rules]]\nid = "big"\neffect = "deny"\ntool = "refund"\n'
                            'args = { amount = { gt = 50 } }\n')  # fmt: skip
    by_file = CliRunner().invoke(
        cli_app, ["rules", "replay", "--since", "2000-01-01", "--file", str(rules_file)], env=env
    )
    assert by_file.exit_code == 0, by_file.output
    assert "big  deny refund: would decide 1; agreements 1, disagreements 0" in by_file.output


CONFIG_TOML = """
[queues.default]
channels = ["inbox"]
[agents.refunds]
path = "refunds_demo:agent"
[[rules]]
id = "small"
effect = "allow"
tool = "refund"
mode = "shadow"
args = { amount = { le = 10 } }
"""
