"""`/v1/rules` over HTTP and `approval-broker rules` in the shell: who may create what, the
status codes and error bodies, revoke kept and listed, and nothing written on bad input."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis import Redis
from typer.testing import CliRunner

from approval_broker.cli import app as cli_app
from tests.support.auth import bearer, person

ADMIN = "tok-admin"


PAT, ALICE, SVC, AUDITOR = (
    bearer("tok-pat"),
    bearer("tok-alice"),
    bearer("tok-svc"),
    bearer("tok-aud"),
)


API_CONFIG = {
    "queues": {"default": {}, "managers": {}},
    "agents": {"refunds": {"path": "pkg.mod:agent"}},
    "approvers": {
        "pat": person("tok-pat", ["policy"]),
        "alice": person("tok-alice", ["finance"]),
        "svc": person("tok-svc", ["requester"]),
        "aud": person("tok-aud", ["auditor"]),
    },
}


@pytest.fixture
def api_settings(monkeypatch):
    from broker.domain.settings import Settings

    monkeypatch.setenv("APPROVAL_BROKER_ADMIN_TOKEN", ADMIN)
    return Settings()


def rule_keys(redis: Redis) -> dict[bytes, Any]:
    return {k: redis.dump(k) for k in sorted(redis.keys("t:rule*"))}


def test_policy_creates_any_scope_and_reads_lists_and_revokes(client) -> None:
    body = {"effect": "deny", "tool": "wire*", "reason": "no wires", "args": {"n": {"gt": 5}}}
    res = client.post("/v1/rules", json=body, headers=PAT)
    assert res.status_code == 201, res.text
    rule = res.json()
    assert rule["created_by"] == "pat" and rule["creator_roles"] is None and rule["hits"] == 0
    assert client.get(f"/v1/rules/{rule['id']}", headers=PAT).json() == rule
    admin = client.post("/v1/rules", json={"effect": "allow", "tool": "t"}, headers=bearer(ADMIN))
    assert admin.status_code == 201 and admin.json()["created_by"] == "admin"
    listed = client.get("/v1/rules", params={"tool": "wire_eu"}, headers=PAT).json()
    assert [r["id"] for r in listed] == [rule["id"]]
    gone = client.delete(f"/v1/rules/{rule['id']}", headers=PAT)
    assert gone.status_code == 200 and gone.json()["revoked_at"] is not None
    assert [r["id"] for r in client.get("/v1/rules?active=true", headers=PAT).json()] == [
        admin.json()["id"]
    ]
    everything = client.get("/v1/rules", headers=PAT).json()
    assert {r["id"]: r["revoked_at"] is not None for r in everything} == {
        rule["id"]: True,
        admin.json()["id"]: False,
    }


def test_without_policy_only_scoped_rules_within_ones_roles(client) -> None:
    scoped = client.post(
        "/v1/rules", json={"effect": "allow", "tool": "refund", "agent": "refunds"}, headers=ALICE
    )
    assert scoped.status_code == 201
    assert scoped.json()["creator_roles"] == ["finance"]
    for body, who, fragment in [
        ({"effect": "allow", "tool": "refund"}, ALICE, "run_id or an agent"),
        ({"effect": "allow", "tool": "r", "run_id": "x", "quorum_bypass": True}, ALICE, "quorum"),
        ({"effect": "allow", "tool": "refund", "run_id": "run_1"}, SVC, "decides nothing"),
        ({"effect": "allow", "tool": "refund", "run_id": "run_1"}, AUDITOR, "decides nothing"),
    ]:
        res = client.post("/v1/rules", json=body, headers=who)
        assert res.status_code == 403, res.text
        assert res.json()["error"] == "forbidden" and fragment in res.json()["detail"]
    # revoking: the creator or role policy; nobody else
    rule_id = scoped.json()["id"]
    other = client.post(
        "/v1/rules", json={"effect": "allow", "tool": "x", "agent": "refunds"}, headers=PAT
    )
    assert client.delete(f"/v1/rules/{other.json()['id']}", headers=ALICE).status_code == 403
    assert client.delete(f"/v1/rules/{rule_id}", headers=ALICE).status_code == 200


def test_auth_and_unknown_ids(client) -> None:
    assert client.get("/v1/rules").status_code == 401
    assert client.post("/v1/rules", json={}, headers=bearer("nope")).status_code == 401
    missing = client.get("/v1/rules/rule_nope", headers=PAT)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert client.delete("/v1/rules/rule_nope", headers=PAT).status_code == 404
    body = {"id": "mine", "effect": "allow", "tool": "t"}
    assert client.post("/v1/rules", json=body, headers=PAT).status_code == 201
    taken = client.post("/v1/rules", json={**body, "effect": "deny"}, headers=PAT)
    assert taken.status_code == 409 and taken.json()["error"] == "rule_exists"
    assert client.get("/v1/rules/mine", headers=PAT).json()["effect"] == "allow"


@pytest.mark.parametrize(
    ("extra", "detail"),
    [
        ({"args": {"amount": {"between": [1, 2]}}}, "args.amount: unknown matcher 'between'"),
        ({"args": {"amount": {"le": "ten"}}}, "args.amount.le: must be a number"),
        ({"args": {"p": {"glob": ""}}}, "args.p.glob: an empty glob"),
        ({"tool": ""}, "tool:"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"agent": "ghost"}, "agent: agent 'ghost' is not defined"),
        ({"queue": "nowhere"}, "queue: queue 'nowhere' is not defined"),
        ({"args": {"n": {"eq": float("nan")}}}, "args.n.eq: numbers must be finite"),
    ],
)
def test_bad_input_is_422_naming_the_field_and_writes_nothing(client, redis, extra, detail):
    before = rule_keys(redis)
    body = {"effect": "allow", "tool": "refund", **extra}
    res = client.post(
        "/v1/rules",
        content=json.dumps(body),
        headers={**PAT, "Content-Type": "application/json"},
    )
    assert res.status_code == 422, res.text
    assert res.json()["error"] == "invalid_rule"
    assert res.json()["detail"].startswith(detail), res.json()["detail"]
    assert rule_keys(redis) == before


def test_a_body_that_is_not_an_object_is_422(client) -> None:
    res = client.post("/v1/rules", json=["effect"], headers=PAT)
    assert res.status_code == 422 and set(res.json()) == {"error", "detail"}


def test_openapi_lists_the_rule_routes(client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths["/v1/rules"]) == {"get", "post"}
    assert set(paths["/v1/rules/{rule_id}"]) == {"get", "delete"}


# --- the CLI ------------------------------------------------------------------------------

runner = CliRunner()


@pytest.fixture
def env(redis_url: str, tmp_config, monkeypatch) -> None:
    path = tmp_config('[queues.default]\n[agents.refunds]\npath = "pkg.mod:agent"\n')
    monkeypatch.setenv("APPROVAL_BROKER_REDIS_URL", redis_url)
    monkeypatch.setenv("APPROVAL_BROKER_CONFIG", str(path))
    monkeypatch.setenv("APPROVAL_BROKER_KEY_PREFIX", "t:")


def cli(*args: str):
    return runner.invoke(cli_app, ["rules", *args])


def test_cli_add_list_revoke(env, redis: Redis) -> None:
    out = cli("add", "--effect", "allow", "--tool", "refund", "--agent", "refunds",
              "--args", '{"amount": {"le": 100}}', "--id", "small")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert out.stdout.strip() == "small: allow refund (active)"
    out = cli("add", "--effect", "deny", "--tool", "wire*", "--reason", "no")
    assert out.exit_code == 0
    listed = cli("list")
    assert "small  allow refund  agent=refunds" in listed.stdout and "wire*" in listed.stdout
    rows = [
        json.loads(line)
        for line in cli("list", "--json", "--agent", "refunds").stdout.split("\n")
        if line
    ]
    assert [r["id"] for r in rows] == ["small"] and rows[0]["created_by"] == "cli"
    out = cli("revoke", "small")
    assert out.exit_code == 0 and out.stdout.startswith("small: revoked at ")
    assert "small" not in cli("list", "--active").stdout
    assert "revoked" in cli("list", "--inactive").stdout


def test_cli_bad_input_is_one_line_and_writes_nothing(env, redis: Redis) -> None:
    before = rule_keys(redis)
    for args, message in [
        (("add", "--effect", "allow", "--tool", "t", "--args", '{"a": {"between": 1}}'),
         "error: args.a: unknown matcher 'between'"),
        (("add", "--effect", "allow", "--tool", "t", "--args", "{nope"),
         "error: --args is not valid JSON"),
        (("add", "--effect", "allow", "--tool", "t", "--agent", "ghost"),
         "error: agent: agent 'ghost' is not defined"),
        (("add", "--effect", "perhaps", "--tool", "t"), "error: effect:"),
        (("revoke", "rule_nope"), "error: no rule 'rule_nope'"),
    ]:  # fmt: skip
        out = cli(*args)
        assert out.exit_code == 1, out.output
        assert out.stderr.startswith(message) and len(out.stderr.strip().splitlines()) == 1
    assert rule_keys(redis) == before
    assert cli("list").stdout.strip() == "no rules"
