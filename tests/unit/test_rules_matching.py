"""Rule matching without Redis: every matcher, dotted paths, deny beats allow, revoked and
expired rules never match, glob tools, suggested rules, who may remember, and bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.domain.errors import Forbidden, InvalidInput
from broker.domain.models import Request
from broker.domain.principals import Principal
from broker.domain.rules.matching import (
    Call,
    creator_roles_for,
    evaluate,
    matches,
    may_remember,
    suggested_rules,
)
from broker.domain.rules.models import Rule, parse_body

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def rule(created: int = 0, **body: Any) -> Rule:
    body.setdefault("effect", "allow")
    body.setdefault("tool", "refund")
    parsed = parse_body(body)
    return Rule.model_validate(
        {
            **parsed.model_dump(),
            "id": body.get("id", f"r{created}"),
            "created_by": "test",
            "created_at": NOW - timedelta(hours=1) + timedelta(seconds=created),
        }
    )


def call(tool: str = "refund", **kw: Any) -> Call:
    return Call(tool_name=tool, **kw)


@pytest.mark.parametrize(
    ("matcher", "hit", "miss"),
    [
        (120, 120, 121),
        (120, 120.0, "120"),
        (True, True, 1),
        ("eur", "eur", "EUR"),
        ([1, 2], [1, 2], [2, 1]),
        ({"eq": {"a": 1}}, {"a": 1}, {"a": 2}),
        ({"in": ["eur", "usd"]}, "usd", "gbp"),
        ({"lt": 100}, 99.5, 100),
        ({"le": 100}, 100, 100.01),
        ({"gt": 0}, 1, 0),
        ({"ge": 0}, 0, -1),
        ({"le": 100}, 50, "50"),
        ({"le": 100}, 50, True),
        ({"prefix": "/tmp/"}, "/tmp/x", "/etc/tmp/x"),
        ({"prefix": "/tmp/"}, "/tmp/", 5),
        ({"glob": "*.csv"}, "a/b.csv", "b.CSV"),
        ({"glob": "report-?"}, "report-1", "report-12"),
    ],
)
def test_every_matcher_holds_and_fails(matcher: Any, hit: Any, miss: Any) -> None:
    r = rule(args={"x": matcher})
    assert matches(r, call(args={"x": hit}), NOW)
    assert not matches(r, call(args={"x": miss}), NOW)


def test_dotted_paths_reach_into_objects_and_lists_and_a_missing_path_never_matches() -> None:
    r = rule(args={"customer.tier": "gold", "items.0.sku": {"prefix": "A-"}})
    args = {"customer": {"tier": "gold"}, "items": [{"sku": "A-1"}]}
    assert matches(r, call(args=args), NOW)
    assert not matches(r, call(args={"customer": {"tier": "gold"}, "items": []}), NOW)
    assert not matches(r, call(args={"items": [{"sku": "A-1"}]}), NOW)
    assert not matches(r, call(args={"customer": "gold", "items": [{"sku": "A-1"}]}), NOW)
    # a matcher that a missing value would satisfy in a loose reading still does not match
    assert not matches(rule(args={"amount": {"lt": 10}}), call(args={}), NOW)


def test_no_args_covers_every_call_of_the_tool_in_scope() -> None:
    r = rule(agent="refunds", queue="default")
    assert matches(r, call(args={"amount": 10**9}, agent="refunds"), NOW)
    assert not matches(r, call(agent="other"), NOW)
    assert not matches(r, call(agent="refunds", queue="managers"), NOW)
    assert not matches(r, call("wire", agent="refunds"), NOW)
    by_run = rule(run_id="run_1")
    assert matches(by_run, call(run_id="run_1"), NOW)
    assert not matches(by_run, call(run_id="run_2"), NOW)
    assert not matches(by_run, call(), NOW)


def test_glob_tools() -> None:
    r = rule(tool="fs_*")
    assert matches(r, call("fs_write"), NOW)
    assert not matches(r, call("net_fetch"), NOW)
    assert matches(rule(tool="fs_[rw]*"), call("fs_read"), NOW)
    assert not matches(rule(tool="fs_[rw]*"), call("fs_delete"), NOW)


def test_deny_beats_allow_whatever_the_order() -> None:
    allow = rule(0, id="allow", args={"amount": {"le": 500}})
    deny = rule(5, id="deny", effect="deny", args={"amount": {"gt": 100}}, reason="too much")
    big = call(args={"amount": 200})
    for rules in ([allow, deny], [deny, allow]):
        assert evaluate(rules, big, NOW) == ("deny", deny)
    assert evaluate([allow, deny], call(args={"amount": 50}), NOW) == ("allow", allow)
    assert evaluate([allow, deny], call(args={"amount": 900}), NOW) == ("deny", deny)
    assert evaluate([allow], call(args={"amount": 900}), NOW) is None
    older, newer = rule(0, id="b-old"), rule(9, id="a-new")
    assert evaluate([newer, older], call(), NOW) == ("allow", older)


def test_revoked_and_expired_rules_never_match() -> None:
    revoked = rule().model_copy(update={"revoked_at": NOW - timedelta(seconds=1)})
    expired = rule(expires_at=(NOW - timedelta(seconds=1)).isoformat())
    expiring = rule(expires_at=(NOW + timedelta(seconds=1)).isoformat())
    assert not matches(revoked, call(), NOW)
    assert not matches(expired, call(), NOW)
    assert matches(expiring, call(), NOW)
    assert not matches(expiring, call(), NOW + timedelta(seconds=1))
    assert evaluate([revoked, expired], call(), NOW) is None
    deny_revoked = rule(effect="deny").model_copy(update={"revoked_at": NOW})
    assert evaluate([deny_revoked, expiring], call(), NOW) == ("allow", expiring)


def test_rules_decide_only_approvals() -> None:
    r = rule(tool="*")
    assert evaluate([r], call(kind="approval"), NOW) is not None
    assert evaluate([r], call(kind="question"), NOW) is None
    assert evaluate([r], call(kind="external"), NOW) is None


def test_a_rule_made_without_policy_covers_only_what_its_creator_could_decide() -> None:
    r = rule(agent="refunds").model_copy(update={"creator_roles": ["finance"]})
    assert matches(r, call(agent="refunds"), NOW)
    assert matches(r, call(agent="refunds", allowed_roles=("finance", "ops")), NOW)
    assert not matches(r, call(agent="refunds", allowed_roles=("ops",)), NOW)
    policy = rule(agent="refunds")
    assert matches(policy, call(agent="refunds", allowed_roles=("ops",)), NOW)


def test_suggested_rules_cover_run_agent_and_a_natural_narrowing() -> None:
    got = suggested_rules("refund", {"amount": 120, "currency": "eur"}, "run_1", "refunds")
    assert got == [
        {"effect": "allow", "tool": "refund", "run_id": "run_1"},
        {"effect": "allow", "tool": "refund", "agent": "refunds"},
        {"effect": "allow", "tool": "refund", "agent": "refunds", "args": {"amount": {"le": 120}}},
    ]
    paths = suggested_rules("write_file", {"path": "/srv/app/logs/a.txt", "n": 3}, "run_1", None)
    assert paths[-1] == {
        "effect": "allow",
        "tool": "write_file",
        "run_id": "run_1",
        "args": {"path": {"prefix": "/srv/app/logs/"}},
    }
    assert suggested_rules("ping", {"host": "a"}, "run_1", "bot") == [
        {"effect": "allow", "tool": "ping", "run_id": "run_1"},
        {"effect": "allow", "tool": "ping", "agent": "bot"},
    ]
    assert suggested_rules("ping", {"flag": True}, None, None) == [
        {"effect": "allow", "tool": "ping"}
    ]
    # every suggestion is a valid body, and the narrowed one covers the call it came from
    for body in got + paths:
        parse_body(body)
    narrowed = rule(**got[-1])
    assert matches(narrowed, call(args={"amount": 120}, agent="refunds"), NOW)
    assert not matches(narrowed, call(args={"amount": 121}, agent="refunds"), NOW)


def _request(allowed_roles: list[str]) -> Request:
    return Request(
        id="req_1",
        tool_call_id="c1",
        tool_name="refund",
        args_hash="x",
        allowed_roles=allowed_roles,
        created_at=NOW,
        expires_at=NOW,
    )


def test_may_remember_needs_policy_for_unscoped_rules_and_the_roles_to_decide() -> None:
    alice = Principal("alice", frozenset({"finance"}))
    policy = Principal("pat", frozenset({"policy"}))
    admin = Principal("admin", frozenset({"*"}))
    unscoped, scoped = (
        parse_body({"effect": "allow", "tool": "refund"}),
        parse_body({"effect": "allow", "tool": "refund", "run_id": "run_1"}),
    )
    may_remember(policy, unscoped)
    may_remember(admin, unscoped)
    may_remember(alice, scoped)
    may_remember(alice, scoped, _request(["finance"]))
    with pytest.raises(Forbidden, match="run_id or an agent"):
        may_remember(alice, unscoped)
    with pytest.raises(Forbidden, match="may not decide"):
        may_remember(alice, scoped, _request(["ops"]))
    for who in (
        Principal("svc", frozenset({"requester"})),
        Principal("aud", frozenset({"auditor"})),
    ):
        with pytest.raises(Forbidden, match="decides nothing"):
            may_remember(who, scoped)
    bypass = parse_body({"effect": "allow", "tool": "t", "agent": "a", "quorum_bypass": True})
    with pytest.raises(Forbidden, match="quorum_bypass"):
        may_remember(alice, bypass)
    may_remember(policy, bypass)
    assert creator_roles_for(policy) is None and creator_roles_for(admin) is None
    assert creator_roles_for(Principal("a", frozenset({"finance", "requester"}))) == ["finance"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"args": {"amount": {"between": [1, 2]}}}, "args.amount: unknown matcher 'between'"),
        ({"args": {"amount": {"lt": 1, "gt": 0}}}, "args.amount: a matcher is a literal or"),
        ({"args": {"amount": {"lt": "100"}}}, "args.amount.lt: must be a number"),
        ({"args": {"amount": {"ge": True}}}, "args.amount.ge: must be a number"),
        ({"args": {"amount": {"le": None}}}, "args.amount.le: must be a number"),
        ({"args": {"path": {"glob": ""}}}, "args.path.glob: an empty glob"),
        ({"args": {"path": {"prefix": 3}}}, "args.path.prefix: must be a string"),
        ({"args": {"c": {"in": []}}}, "args.c.in: must be a non-empty list"),
        ({"args": {"c": {"in": "eur"}}}, "args.c.in: must be a non-empty list"),
        ({"args": {"a..b": 1}}, "args.a..b: an arg path is dotted names"),
        ({"tool": ""}, "tool: String should have at least 1 character"),
        ({"tool": "  "}, "tool: an empty glob"),
        ({"effect": "maybe"}, "effect: Input should be 'allow', 'deny' or 'route'"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"hits": 5}, "hits: unknown field"),
        ({"expires_at": "2026-12-31T00:00:00"}, "expires_at: must carry a time zone"),
        ({"id": "a b"}, "id: String should match pattern"),
    ],
)
def test_bad_bodies_are_refused_naming_the_field(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_body({"effect": "allow", "tool": "refund", **body})
    assert info.value.code == "invalid_rule"
    assert info.value.detail.startswith(message), info.value.detail


def test_bad_bodies_in_the_config_name_the_key() -> None:
    with pytest.raises(InvalidInput, match=r"^rules\[2\]\.args\.amount: unknown matcher 'between'"):
        parse_body({"effect": "deny", "tool": "t", "args": {"amount": {"between": 1}}}, "rules[2]")
    with pytest.raises(InvalidInput, match=r"^rules\[0\]: must be an object"):
        parse_body(["effect"], "rules[0]")


def test_a_call_of_a_request_carries_what_rules_look_at() -> None:
    req = _request(["finance"]).model_copy(update={"run_id": "run_1", "args": {"amount": 5}})
    c = Call.of(req, agent="refunds")
    assert c == Call(
        "refund", {"amount": 5}, "run_1", "refunds", "default", "approval", ("finance",)
    )
    r = rule(run_id="run_1").model_copy(update={"creator_roles": ["ops"]})
    assert not matches(r, c, NOW)
    assert matches(r.model_copy(update={"creator_roles": ["finance"]}), c, NOW)
