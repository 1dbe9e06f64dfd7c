"""The decision service every channel shares: the CLI and REST answer repeats the same way, a
request that moved is refused in the atomic step, a token decides only through the inbox,
queue roles apply on top of a request's own, and what reaches a terminal is printable."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import create_app
from approval_broker.cli import app as cli_app
from broker.domain.config import Config, load_config
from broker.domain.errors import Conflict, InvalidInput
from broker.domain.models import Decision, NewRequest, Outcome, Request
from broker.domain.principals import Principal, hash_token
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.judge import Judge
from tests.support.auth import bearer
from tests.support.backends import on_backend, on_backend_api_broker, on_backend_broker  # noqa: F401 - redis, broker, api_broker on both backends

ADMIN = "admin-token-of-the-deciding-tests"
CONFIG = f"""
[queues.default]
channels = ["inbox"]
escalate_to = "managers"
[queues.managers]
channels = ["inbox"]
[queues.hooks]
channels = ["webhook:ops"]
[queues.money]
channels = ["inbox"]
roles = ["finance"]

[webhooks.ops]
url = "http://127.0.0.1:9/hook"
secret = "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1vcHMtd2ViaG9vayE="
roles = ["ops"]

[approvers.alice]
token_sha256 = "{hash_token("tok-alice")}"
roles = ["finance"]
[approvers.bob]
token_sha256 = "{hash_token("tok-bob")}"
roles = ["ops"]
[approvers.dave]
token_sha256 = "{hash_token("tok-dave")}"
roles = ["finance", "ops", "requester"]
"""
runner = CliRunner()


ALICE, BOB, DAVE = bearer("tok-alice"), bearer("tok-bob"), bearer("tok-dave")


@pytest.fixture
def config_path(tmp_config: Any) -> Path:
    return tmp_config(CONFIG)  # type: ignore[no-any-return]


@pytest.fixture(name="cfg")
def cfg_loaded_from_a_file(config_path: Path) -> Config:
    return load_config(config_path)


@pytest.fixture
def client(api_broker: Broker, cfg: Config) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(admin_token=ADMIN), cfg, api_broker)) as c:
        yield c


@pytest.fixture
def cli_env(
    backend_env: dict[str, str], config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in backend_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("APPROVAL_BROKER_CONFIG", str(config_path))
    monkeypatch.setenv("APPROVAL_BROKER_KEY_PREFIX", "t:")
    monkeypatch.delenv("APPROVAL_BROKER_ADMIN_TOKEN", raising=False)


def make(broker: Broker, **kw: Any) -> Request:
    kw.setdefault("tool_name", "refund")
    kw.setdefault("args", {"amount": 120})
    return broker.create_request(NewRequest(**kw))


def cli(*args: str) -> Any:
    return runner.invoke(cli_app, list(args))


def rest_decide(client: TestClient, rid: str, body: dict[str, Any], who: dict[str, str]) -> Any:
    return client.post(f"/v1/requests/{rid}/decision", json=body, headers=who)


# ---- the CLI and REST give the same answers ---------------------------------------------


def test_a_repeated_decision_is_not_an_error_from_the_shell_or_over_rest(
    client: TestClient, api_broker: Broker, cli_env: None
) -> None:
    over_rest, from_shell = make(api_broker), make(api_broker)
    assert rest_decide(client, over_rest.id, {"outcome": "approved"}, ALICE).status_code == 200
    again = rest_decide(client, over_rest.id, {"outcome": "approved"}, ALICE)
    assert again.status_code == 200 and again.json()["status"] == "approved"

    first = cli("decide", from_shell.id, "approve", "--by", "alice")
    second = cli("decide", from_shell.id, "approve", "--by", "alice")
    assert first.exit_code == 0 and f"{from_shell.id}: approved" in first.stdout
    assert second.exit_code == 0 and f"{from_shell.id}: approved" in second.stdout
    assert "already so" in second.stdout
    # and across the two: alice repeating from the shell what she decided over REST
    across = cli("decide", over_rest.id, "approve", "--by", "alice")
    assert across.exit_code == 0, across.output
    for rid in (over_rest.id, from_shell.id):
        decision = api_broker.get_request(rid).decision
        assert decision is not None and decision.decided_by == "alice"
    # someone else's decision is a conflict on both
    assert rest_decide(client, from_shell.id, {"outcome": "rejected"}, ALICE).status_code == 409
    other = cli("decide", over_rest.id, "reject", "--by", "bob")
    assert other.exit_code == 1 and "already approved" in other.stderr


def test_a_repeated_escalation_moves_the_request_once_from_the_shell_or_over_rest(
    client: TestClient, api_broker: Broker, cli_env: None
) -> None:
    over_rest, from_shell = make(api_broker), make(api_broker)
    for _ in range(2):
        resp = rest_decide(client, over_rest.id, {"outcome": "escalated"}, ALICE)
        assert resp.status_code == 200 and resp.json()["queue"] == "managers"
    for _ in range(2):
        out = cli("decide", from_shell.id, "escalate", "--by", "alice")
        assert out.exit_code == 0 and "pending (queue managers)" in out.stdout, out.output
    for rid in (over_rest.id, from_shell.id):
        moved = api_broker.get_request(rid)
        assert moved.queue == "managers"
        assert [h.event for h in moved.history].count("escalated") == 1


# ---- the atomic step refuses a request that moved ----------------------------------------


def test_a_request_escalated_after_it_was_read_is_not_decided_from_the_old_queue(
    api_broker: Broker, cfg: Config
) -> None:
    """The channel check reads the request, then the atomic step checks it is still there."""
    req = make(api_broker)
    seen = api_broker.get_request(req.id)  # as the channel saw it: in `default`
    api_broker.escalate(req.id, decided_by="sweeper")
    alice = Principal("alice", frozenset({"finance"}))
    with pytest.raises(Conflict) as caught:
        Judge(api_broker, cfg).decide(
            req.id, Decision(outcome=Outcome.approved), alice, via=["inbox"], current=seen
        )
    assert caught.value.code == "escalated"
    after = api_broker.get_request(req.id)
    assert after.is_pending and after.queue == "managers" and after.decision is None


def test_validity_is_judged_before_the_atomic_step(api_broker: Broker, cfg: Config) -> None:
    q = make(api_broker, kind="question")
    admin = Principal("admin", frozenset({"*"}))
    judge = Judge(api_broker, cfg)
    for decision, code in [
        (Decision(outcome=Outcome.approved), "wrong_kind"),
        (Decision(outcome=Outcome.answered, answer="x", args_hash="0" * 64), "stale_args"),
        (Decision(outcome=Outcome.escalated, target="nowhere"), "unknown_queue"),
        (Decision(outcome=Outcome.escalated, target="default"), "same_queue"),
        (Decision(outcome=Outcome.timed_out), "invalid"),
    ]:
        with pytest.raises(InvalidInput) as caught:
            judge.decide(q.id, decision, admin, via=())
        assert caught.value.code == code
    assert api_broker.get_request(q.id).is_pending


# ---- a token decides through the inbox -------------------------------------------------


def test_a_token_decides_only_requests_whose_queue_has_the_inbox(
    client: TestClient, api_broker: Broker
) -> None:
    req = make(api_broker, queue="hooks")  # decided through webhook:ops only
    resp = rest_decide(client, req.id, {"outcome": "approved"}, BOB)
    assert resp.status_code == 403 and resp.json()["error"] == "forbidden"
    assert "queue hooks is decided through webhook:ops" in resp.json()["detail"]
    assert api_broker.get_request(req.id).is_pending
    admin = rest_decide(client, req.id, {"outcome": "approved"}, bearer(ADMIN))
    assert admin.status_code == 200 and admin.json()["decision"]["decided_by"] == "admin"


# ---- queue roles -----------------------------------------------------------------------


def test_queue_roles_apply_on_top_of_a_requests_own(client: TestClient, api_broker: Broker) -> None:
    anyone = make(api_broker, queue="money")  # allowed_roles [] = any approver ... of the queue
    resp = rest_decide(client, anyone.id, {"outcome": "approved"}, BOB)
    assert resp.status_code == 404  # out of bob's sight: as if it did not exist (GET answers so)
    assert rest_decide(client, anyone.id, {"outcome": "approved"}, ALICE).status_code == 200

    ops_only = make(api_broker, queue="money", allowed_roles=["ops"])
    assert rest_decide(client, ops_only.id, {"outcome": "approved"}, ALICE).status_code == 404
    assert rest_decide(client, ops_only.id, {"outcome": "approved"}, BOB).status_code == 404
    assert api_broker.get_request(ops_only.id).is_pending
    both = rest_decide(client, ops_only.id, {"outcome": "approved"}, DAVE)  # finance AND ops
    assert both.status_code == 200 and both.json()["decision"]["decided_by"] == "dave"


def test_allowed_roles_must_name_roles_someone_holds(client: TestClient) -> None:
    body = {"tool_name": "wire", "allowed_roles": ["finance", "treasury"]}
    resp = client.post("/v1/requests", json=body, headers=DAVE)
    assert resp.status_code == 422 and resp.json()["error"] == "unknown_role"
    assert "treasury" in resp.json()["detail"] and "finance" not in resp.json()["detail"]
    assert client.get("/v1/requests", headers=bearer(ADMIN)).json() == []
    ok = client.post("/v1/requests", json={**body, "allowed_roles": ["ops"]}, headers=DAVE)
    assert ok.status_code == 201  # "ops" is held by bob and by the ops webhook endpoint


# ---- what reaches a terminal ------------------------------------------------------------


def test_pending_shows_tool_and_args_without_control_or_bidi_characters(
    api_broker: Broker, cli_env: None
) -> None:
    req = make(
        api_broker,
        tool_name="wire",
        args={"to": "ACME\u202e\x1b[2J", "amount": 5},
        prompt="Pay\x1b[31m now\nplease \u2066ok\u2069",
    )
    out = cli("pending")
    assert out.exit_code == 0
    (line,) = out.stdout.splitlines()
    # JSON shows a control character escaped; a bidi override is dropped
    assert req.id in line and 'wire {"amount": 5, "to": "ACME\\u001b[2J"}' in line
    assert "Pay[31m now please ok" in line
    assert not any(ch in line for ch in "\x1b\u202e\u2066\u2069")
    shown = json.loads(cli("pending", "--json").stdout)  # JSON keeps the data as it is
    assert shown["args"]["to"] == "ACME\u202e\x1b[2J"


def test_decided_by_is_recorded_without_control_or_bidi_characters(
    api_broker: Broker, cli_env: None
) -> None:
    req = make(api_broker)
    out = cli("decide", req.id, "approve", "--by", "ali\u202ece\x07")
    assert out.exit_code == 0, out.output
    decision = api_broker.get_request(req.id).decision
    assert decision is not None and decision.decided_by == "alice"


@pytest.mark.parametrize("command", ["api", "up"])
def test_a_short_admin_token_is_refused_at_start(
    cli_env: None, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setenv("APPROVAL_BROKER_ADMIN_TOKEN", "letmein")
    out = cli(command, "--port", "1")
    assert out.exit_code == 1 and "Traceback" not in out.output
    (line,) = out.stderr.strip().splitlines()
    assert "APPROVAL_BROKER_ADMIN_TOKEN is 7 characters; it needs at least 24" in line
