"""Routing rules on a real Redis: a `route` rule sets a new approval's queue, quorum, timeout,
on_timeout and risk in the create step (history `routed_by_rule`, the rule's hit); deny beats
allow beats route, and among routes the highest priority, then the most specific, wins; only
role `policy` (or the admin) makes one; bad input is a 422 naming the field with nothing
stored; the sweeper honours on_timeout; config routes; shadow routes and replay."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from redis import Redis
from typer.testing import CliRunner

from api.app import create_app
from approval_broker.cli import app as cli_app
from broker.domain.config import parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import NewRequest, Status
from broker.domain.rules.models import parse_body
from broker.domain.settings import Settings
from broker.facade import Broker, RuleStore
from broker.store.rule_sync import sync_at_start
from tests.support.auth import bearer, person

ADMIN = "tok-admin-routing-0123456789abcd"
CONFIG: dict[str, Any] = {
    "queues": {
        "default": {"channels": ["inbox"], "timeout_s": 600, "escalate_to": "managers"},
        "finance": {"channels": ["inbox"], "timeout_s": 1800, "escalate_to": "managers"},
        "managers": {"channels": ["inbox"], "timeout_s": 3600},
    },
    "approvers": {
        "pat": person("tok-pat", ["policy"]),
        "alice": person("tok-alice", ["finance"]),
        "svc": person("tok-svc", ["requester"]),
    },
}
BIG = {"id": "big", "effect": "route", "tool": "refund", "args": {"amount": {"gt": 500}},
       "route": {"queue": "finance", "quorum": 2, "risk": "high: refund over 500"}}  # fmt: skip


@pytest.fixture
def broker(redis: Redis) -> Broker:
    return Broker(redis, parse_config(CONFIG), prefix="t:")


@pytest.fixture
def api(broker: Broker) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(admin_token=ADMIN), broker.config, broker)) as client:
        yield client


def add(rules: RuleStore, body: dict[str, Any], created_at: datetime | None = None) -> None:
    rule = rules.create(parse_body(body), created_by="pat")
    if created_at is not None:  # seed: an older rule (ties between routes go to the oldest)
        rules.redis.hset(rules.keys.rule(rule.id), "created_at", repr(created_at.timestamp()))
        rules.redis.incr(rules.keys.version)


def refund(broker: Broker, amount: float, **more: Any) -> Any:
    return broker.create_request(NewRequest(tool_name="refund", args={"amount": amount}, **more))


def test_a_route_sets_queue_quorum_timeout_and_risk_in_the_create_step(broker: Broker) -> None:
    add(broker.requests.rules, {**BIG, "route": {**BIG["route"], "timeout_s": 900,
                                                 "on_timeout": "reject"}})  # fmt: skip
    small, big = refund(broker, 100), refund(broker, 800)
    assert (small.queue, small.quorum, small.risk) == ("default", 1, None)
    for seen in (big, broker.get_request(big.id)):  # as made, and as stored
        assert (seen.queue, seen.quorum, seen.risk) == ("finance", 2, "high: refund over 500")
        assert seen.status is Status.pending
        [entry] = [h for h in seen.history if h.event == "routed_by_rule"]
        assert entry.rule == "big" and entry.by == "rule:big"
        assert (entry.from_queue, entry.to_queue) == ("default", "finance")
        assert entry.route == {"queue": "finance", "quorum": 2, "timeout_s": 900.0,
                               "on_timeout": "reject", "risk": "high: refund over 500"}  # fmt: skip
    waits = (big.expires_at - big.created_at).total_seconds()
    assert round(waits) == 900  # the route's timeout, not finance's 1800
    keys = broker.keys
    assert broker.redis.zscore(keys.pending_in("finance"), big.id) is not None
    assert broker.redis.zscore(keys.pending_in("default"), big.id) is None
    assert broker.requests.rules.get("big").hits == 1
    assert broker.get_request(small.id).risk is None
    listed = broker.list_requests(queue="finance")
    assert [r.id for r in listed] == [big.id]


def test_a_route_never_lowers_a_quorum_and_keeps_the_asked_timeout_without_its_own(
    broker: Broker,
) -> None:
    add(broker.requests.rules, {"id": "q", "effect": "route", "tool": "refund",
                                "route": {"queue": "finance", "quorum": 2}})  # fmt: skip
    asked = refund(broker, 10, quorum=3, timeout_s=120)
    assert (asked.queue, asked.quorum) == ("finance", 3)
    assert round((asked.expires_at - asked.created_at).total_seconds()) == 120


def test_deny_beats_allow_beats_route(broker: Broker) -> None:
    rules = broker.requests.rules
    add(rules, BIG)
    add(rules, {"id": "ok", "effect": "allow", "tool": "refund", "args": {"amount": {"le": 1000}}})
    add(rules, {"id": "no", "effect": "deny", "tool": "refund", "args": {"amount": {"gt": 5000}},
                "reason": "too big"})  # fmt: skip
    allowed, denied, routed = refund(broker, 800), refund(broker, 9000), refund(broker, 2000)
    assert allowed.status is Status.approved and allowed.decision.rule == "ok"
    assert allowed.queue == "default" and allowed.risk is None  # an allow: no route applies
    assert denied.status is Status.rejected and denied.decision.reason == "too big"
    assert routed.status is Status.pending and routed.queue == "finance"
    assert rules.get("big").hits == 1


def test_among_routes_priority_then_specificity_then_age_wins(broker: Broker) -> None:
    rules = broker.requests.rules
    old = datetime.now(UTC) - timedelta(days=1)
    add(rules, {"id": "wide", "effect": "route", "tool": "ref*", "route": {"risk": "wide"}}, old)
    add(rules, {"id": "narrow", "effect": "route", "tool": "refund",
                "args": {"amount": {"gt": 100}}, "route": {"risk": "narrow"}})  # fmt: skip
    # the most specific wins a tie of priorities (an exact tool and one arg over a glob)
    assert refund(broker, 200).risk == "narrow"
    assert refund(broker, 50).risk == "wide"  # only the glob matches
    add(rules, {"id": "urgent", "effect": "route", "tool": "ref*", "priority": 5,
                "route": {"risk": "urgent", "queue": "managers"}})  # fmt: skip
    top = refund(broker, 200)
    assert (top.risk, top.queue) == ("urgent", "managers")  # priority beats specificity
    # equal priority and specificity: the oldest
    add(rules, {"id": "twin-new", "effect": "route", "tool": "refund", "priority": 9,
                "route": {"risk": "new"}})  # fmt: skip
    add(rules, {"id": "twin-old", "effect": "route", "tool": "refund", "priority": 9,
                "route": {"risk": "old"}}, old)  # fmt: skip
    assert refund(broker, 200).risk == "old"


def test_only_policy_or_the_admin_may_create_a_route_rule(api: TestClient, redis: Redis) -> None:
    body = {**BIG, "id": None}
    body.pop("id")
    for who in ("tok-alice", "tok-svc"):
        got = api.post("/v1/rules", json={**body, "agent": "x"}, headers=bearer(who))
        assert got.status_code == 403, got.text
        assert "route" in got.json()["detail"] or who == "tok-svc"
    assert api.get("/v1/rules", headers=bearer(ADMIN)).json() == []
    made = api.post("/v1/rules", json=body, headers=bearer("tok-pat"))
    assert made.status_code == 201, made.text
    assert made.json()["route"]["queue"] == "finance" and made.json()["effect"] == "route"
    assert api.post("/v1/rules", json=body, headers=bearer(ADMIN)).status_code == 201


@pytest.mark.parametrize(
    ("route", "detail"),
    [
        ({"queue": "finance", "colour": "red"}, "route.colour: unknown field"),
        ({"queue": "nowhere"}, "route.queue: queue 'nowhere' is not defined"),
        ({"quorum": 0}, "route.quorum: Input should be greater than or equal to 1"),
        ({"quorum": 11}, "route.quorum: Input should be less than or equal to 10"),
        ({"timeout_s": -5}, "route.timeout_s: Input should be greater than 0"),
        ({"on_timeout": "ignore"}, "route.on_timeout: Input should be 'reject' or 'escalate'"),
        ({"queue": "managers", "on_timeout": "escalate"}, "route.on_timeout: queue 'managers'"),
        ({}, "route: a route rule sets at least one of"),
    ],
)
def test_bad_route_input_is_422_naming_the_field_and_stores_nothing(
    api: TestClient, redis: Redis, route: dict[str, Any], detail: str
) -> None:
    body = {"effect": "route", "tool": "refund", "route": route}
    got = api.post("/v1/rules", json=body, headers=bearer("tok-pat"))
    assert got.status_code == 422, got.text
    assert got.json()["error"] == "invalid_rule" and detail in got.json()["detail"]
    assert api.get("/v1/rules", headers=bearer(ADMIN)).json() == []
    assert redis.keys("t:rule:*") == []


def test_a_route_or_priority_on_another_effect_is_refused(api: TestClient) -> None:
    for extra in ({"route": {"queue": "finance"}}, {"priority": 3}):
        got = api.post("/v1/rules", json={"effect": "allow", "tool": "x", **extra},
                       headers=bearer("tok-pat"))  # fmt: skip
        assert got.status_code == 422 and got.json()["error"] == "invalid_rule"


def test_the_sweeper_honours_on_timeout(broker: Broker) -> None:
    rules = broker.requests.rules
    add(rules, {"id": "r", "effect": "route", "tool": "refund", "args": {"amount": {"gt": 500}},
                "route": {"queue": "finance", "timeout_s": 60, "on_timeout": "reject"}})  # fmt: skip
    add(rules, {"id": "e", "effect": "route", "tool": "refund", "args": {"amount": {"le": 500}},
                "route": {"queue": "finance", "timeout_s": 60, "on_timeout": "escalate"}})  # fmt: skip
    rejected, escalated = refund(broker, 900), refund(broker, 100)
    later = datetime.now(UTC) + timedelta(seconds=120)
    done = {r.request_id: r.action for r in broker.sweep(now=later.timestamp())}
    assert done == {rejected.id: "timed_out", escalated.id: "escalated"}
    assert broker.get_request(rejected.id).status is Status.timed_out  # finance would escalate
    moved = broker.get_request(escalated.id)
    assert moved.status is Status.pending and moved.queue == "managers"


def test_config_rules_may_route_and_a_bad_one_names_its_key(broker: Broker, redis: Redis) -> None:
    config = parse_config({**CONFIG, "rules": [BIG]})
    routed = Broker(redis, config, prefix="t:")
    sync_at_start(routed.requests.rules)
    made = refund(routed, 700)
    assert (made.queue, made.quorum) == ("finance", 2)
    bad = {**BIG, "route": {"queue": "nowhere"}}
    with pytest.raises(ConfigError, match=r"rules\[0\]\.route\.queue: queue 'nowhere'"):
        parse_config({**CONFIG, "rules": [bad]})


def test_a_shadow_route_moves_nothing_and_records_where_it_would_have(broker: Broker) -> None:
    add(broker.requests.rules, {**BIG, "mode": "shadow"})
    made = refund(broker, 700)
    assert (made.queue, made.quorum, made.risk) == ("default", 1, None)
    [entry] = [h for h in broker.get_request(made.id).history if h.event == "shadow_rule"]
    assert entry.rule == "big"
    assert entry.detail == "would route to finance (quorum 2, risk high: refund over 500)"


def test_replay_says_where_past_requests_would_have_gone(
    broker: Broker, redis_url: str, tmp_config: Any, tmp_path: Path
) -> None:
    refund(broker, 700)
    refund(broker, 900)
    refund(broker, 100)
    toml = "\n".join(
        [
            '[queues.default]\nchannels = ["inbox"]\nescalate_to = "managers"',
            '[queues.finance]\nchannels = ["inbox"]\nescalate_to = "managers"',
            '[queues.managers]\nchannels = ["inbox"]',
        ]
    )
    rules = tmp_path / "routes.toml"
    rules.write_text(
        '[[rules]]\nid = "big"\neffect = "route"\ntool = "refund"\n'
        "args = { amount = { gt = 500 } }\n"
        'route = { queue = "finance", quorum = 2, risk = "high" }\n'
    )
    env = {
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_KEY_PREFIX": "t:",
        "APPROVAL_BROKER_CONFIG": str(tmp_config(toml)),
    }
    args = ["rules", "replay", "--since", "2000-01-01", "--file", str(rules)]
    out = CliRunner().invoke(cli_app, args, env=env)
    assert out.exit_code == 0, out.output
    assert (
        "big  route refund: would route 2 to finance (quorum 2, risk high);"
        " they waited in: default 2; unknown 0" in out.output
    )
    as_json = CliRunner().invoke(cli_app, [*args, "--json"], env=env)
    [report] = [json.loads(line) for line in as_json.output.splitlines() if line.startswith("{")]
    assert report["route"] == {"queue": "finance", "quorum": 2, "risk": "high"}
    assert report["came_from"] == {"default": 2} and len(report["would_decide"]) == 2


def test_a_route_rule_revoked_by_another_process_is_not_applied(
    broker: Broker, redis: Redis
) -> None:
    add(broker.requests.rules, BIG)
    assert refund(broker, 700).queue == "finance"  # this process's rule set is cached
    other = Broker(redis, broker.config, prefix="t:")  # another API or worker
    other.requests.rules.revoke("big", by="pat")
    after = refund(broker, 700)  # the step refuses the old rule set; matched again: no route
    assert (after.queue, after.quorum, after.risk) == ("default", 1, None)
    assert broker.requests.rules.get("big").hits == 1


def test_a_route_rule_removed_without_a_version_bump_is_refused_by_the_step(
    broker: Broker, redis: Redis
) -> None:
    add(broker.requests.rules, BIG)
    assert refund(broker, 700).queue == "finance"
    # the rule's hash revoked behind the cache's back (the version unchanged): the step's own
    # re-check refuses it and the create goes on without it
    redis.hset(broker.requests.rules.keys.rule("big"), "revoked_at", "1")
    after = refund(broker, 800)
    assert after.queue == "default" and after.risk is None


def test_the_cli_adds_a_route_rule_as_the_docs_show(
    broker: Broker, redis_url: str, tmp_config: Any
) -> None:
    toml = "\n".join(
        [
            '[queues.default]\nchannels = ["inbox"]\nescalate_to = "managers"',
            '[queues.finance]\nchannels = ["inbox"]\nescalate_to = "managers"',
            '[queues.managers]\nchannels = ["inbox"]',
        ]
    )
    env = {
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_KEY_PREFIX": "t:",
        "APPROVAL_BROKER_CONFIG": str(tmp_config(toml)),
    }
    args = ["rules", "add", "--effect", "route", "--tool", "refund", "--args",
            '{"amount": {"gt": 500}}', "--route", '{"queue": "finance", "quorum": 2, "risk": "high"}']  # fmt: skip
    out = CliRunner().invoke(cli_app, args, env=env)
    assert out.exit_code == 0, out.output
    assert refund(broker, 700).queue == "finance"
    listed = CliRunner().invoke(cli_app, ["rules", "list"], env=env)
    assert "route refund  any scope args=" in listed.output
    assert "to finance (quorum 2, risk high)" in listed.output
    bad = CliRunner().invoke(cli_app, [*args[:-1], '{"queue": "nowhere"}'], env=env)
    assert bad.exit_code == 1
    assert bad.output.strip() == "error: route.queue: queue 'nowhere' is not defined"
