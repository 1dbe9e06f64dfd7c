"""Approval receipts: signed with every outcome that lets something run, verifiable with the JWKS.

Through the API (REST decide, rule decisions at create, a quorum) the receipt comes back with
the decision; `GET /.well-known/jwks.json` verifies it with a JOSE library (joserfc here, as any
app would); each way a receipt can fail is refused with its named reason; a rotated-out key in
`previous_key_files` still verifies, a key dropped from the JWKS does not.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from joserfc import jwt
from joserfc.jwk import KeySet

from broker.domain.config import Config, parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import Decision, NewRequest, args_hash
from broker.domain.principals import Principal, hash_token
from broker.domain.receipts import CallFacts, ReceiptKeys, ReceiptRefused, Receipts
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.judge import Judge
from broker.receipts.signing_key import prepare_receipt_key, private_key_file
from broker.rules import sync_at_start
from tests.support.receipts import key_file, receipts_config

TOKENS = {
    "ann": "tok-ann-0123456789abcdef0123",
    "bob": "tok-bob-0123456789abcdef0123",
    "app": "tok-app-0123456789abcdef0123",
}


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return key_file(tmp_path)


@pytest.fixture(name="cfg")
def cfg_with_a_receipt_key(key: Path) -> Config:
    raw = receipts_config(key)
    raw["queues"]["pair"] = {"channels": ["inbox"], "quorum": 2}
    raw["approvers"]["app"] = {"roles": ["requester"]}
    for name, token in TOKENS.items():
        raw["approvers"][name]["token_sha256"] = hash_token(token)
    raw["rules"] = [{"id": "small", "effect": "allow", "tool": "small_refund"}]
    return parse_config(raw)


def _auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def _create(client: TestClient, **body: Any) -> dict[str, Any]:
    answer = client.post("/v1/requests", json={"tool_name": "refund", **body}, headers=_auth("app"))
    assert answer.status_code == 201, answer.text
    return answer.json()


def _claims(client: TestClient, token: str) -> dict[str, Any]:
    """Verify `token` as an app would: the JWKS over HTTP (no token), any JOSE library."""
    jwks = client.get("/.well-known/jwks.json")
    assert jwks.status_code == 200
    keys = KeySet.import_key_set(jwks.json())
    return dict(jwt.decode(token, keys, algorithms=["EdDSA"]).claims)


def test_an_approval_over_rest_carries_a_receipt_the_jwks_verifies(client: TestClient) -> None:
    made = _create(client, args={"order": "A1", "amount": 12})
    answer = client.post(
        f"/v1/requests/{made['id']}/decision", json={"outcome": "approved"}, headers=_auth("ann")
    )
    assert answer.status_code == 200, answer.text
    receipt = answer.json()["decision"]["receipt"]
    claims = _claims(client, receipt)
    assert claims["iss"] == "approval-broker" and claims["sub"] == made["id"]
    assert claims["tool_name"] == "refund" and claims["tool_call_id"] == made["tool_call_id"]
    assert claims["args_hash"] == args_hash({"order": "A1", "amount": 12}) == made["args_hash"]
    assert claims["outcome"] == "approved" and claims["decided_by"] == "ann"
    assert claims["exp"] - claims["iat"] == 900 and claims["jti"]
    assert "rule" not in claims and "quorum" not in claims
    again = client.get(f"/v1/requests/{made['id']}", headers=_auth("ann")).json()
    assert again["decision"]["receipt"] == receipt  # stored with the decision


def test_a_modified_decision_signs_the_hash_of_the_new_args(client: TestClient) -> None:
    made = _create(client, args={"order": "A1"})
    body = {"outcome": "modified", "args": {"order": "A2"}}
    answer = client.post(f"/v1/requests/{made['id']}/decision", json=body, headers=_auth("ann"))
    claims = _claims(client, answer.json()["decision"]["receipt"])
    assert claims["outcome"] == "modified" and claims["args_hash"] == args_hash({"order": "A2"})


def test_a_rejection_has_no_receipt_and_a_caller_can_not_give_one(client: TestClient) -> None:
    made = _create(client)
    url = f"/v1/requests/{made['id']}/decision"
    forged = {"outcome": "approved", "receipt": "forged.by.caller"}
    assert client.post(url, json=forged, headers=_auth("ann")).status_code == 422
    answer = client.post(url, json={"outcome": "rejected", "reason": "no"}, headers=_auth("ann"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["decision"].get("receipt") is None


def test_an_answer_carries_a_receipt(client: TestClient) -> None:
    made = _create(client, kind="question", prompt="Which?")
    body = {"outcome": "answered", "answer": "the blue one"}
    answer = client.post(f"/v1/requests/{made['id']}/decision", json=body, headers=_auth("ann"))
    assert _claims(client, answer.json()["decision"]["receipt"])["outcome"] == "answered"


def test_a_rule_decision_at_create_carries_a_receipt_naming_the_rule(
    client: TestClient, api_broker: Broker
) -> None:
    sync_at_start(api_broker.requests.rules)  # the config's [[rules]], as every role does
    made = _create(client, tool_name="small_refund", args={"order": "A3"})
    assert made["status"] == "approved"
    claims = _claims(client, made["decision"]["receipt"])
    assert claims["rule"] == "small" and claims["decided_by"] == "rule:small"
    assert claims["sub"] == made["id"]
    stored = client.get(f"/v1/requests/{made['id']}", headers=_auth("ann")).json()
    assert stored["decision"]["receipt"] == made["decision"]["receipt"]


def test_a_quorum_receipt_names_the_votes(client: TestClient) -> None:
    made = _create(client, queue="pair")
    url = f"/v1/requests/{made['id']}/decision"
    first = client.post(url, json={"outcome": "approved"}, headers=_auth("ann")).json()
    assert first["status"] == "pending" and "decision" not in (first.get("decision") or {})
    last = client.post(url, json={"outcome": "approved"}, headers=_auth("bob")).json()
    claims = _claims(client, last["decision"]["receipt"])
    assert claims["quorum"] == {"required": 2, "votes": ["ann", "bob"]}


def test_the_jwks_needs_no_token_and_holds_only_public_keys(client: TestClient) -> None:
    keys = client.get("/.well-known/jwks.json").json()["keys"]
    assert len(keys) == 1 and keys[0]["kty"] == "OKP" and keys[0]["crv"] == "Ed25519"
    assert keys[0]["alg"] == "EdDSA" and keys[0]["kid"] and "d" not in keys[0]


def test_spending_over_the_api_holds_once(client: TestClient) -> None:
    made = _create(client, args={"order": "A1"})
    client.post(
        f"/v1/requests/{made['id']}/decision", json={"outcome": "approved"}, headers=_auth("ann")
    )
    url = f"/v1/requests/{made['id']}/receipt/spend"
    body = {"tool_name": "refund", "args": {"order": "A1"}}
    first = client.post(url, json=body, headers=_auth("app"))
    assert first.status_code == 200, first.text
    again = client.post(url, json=body, headers=_auth("app"))
    assert again.status_code == 409
    assert again.json()["error"] == "receipt_refused" and again.json()["reason"] == "spent"


def test_spending_with_other_args_is_refused_and_spends_nothing(client: TestClient) -> None:
    made = _create(client, args={"order": "A1"})
    client.post(
        f"/v1/requests/{made['id']}/decision", json={"outcome": "approved"}, headers=_auth("ann")
    )
    url = f"/v1/requests/{made['id']}/receipt/spend"
    changed = client.post(url, json={"tool_name": "refund", "args": {"order": "A9"}}, headers=_auth("app"))  # fmt: skip
    assert changed.status_code == 409 and changed.json()["reason"] == "args_changed"
    right = client.post(url, json={"tool_name": "refund", "args": {"order": "A1"}}, headers=_auth("app"))  # fmt: skip
    assert right.status_code == 200


def test_the_refusal_is_a_metric(client: TestClient) -> None:
    made = _create(client, args={"order": "A1"})
    client.post(f"/v1/requests/{made['id']}/receipt/spend", json={"tool_name": "refund"}, headers=_auth("app"))  # fmt: skip
    text = client.get("/metrics").text
    assert 'approval_broker_receipts_refused_total{reason="missing"} 1.0' in text
    assert 'approval_broker_requests{queue="missing"' not in text


# ---- the checks themselves, each refusal named --------------------------------------------


CALL = CallFacts("r1", "refund", "c1", "run1", {"order": "A1"})


def _signed(receipts: Receipts, **over: Any) -> str:
    claims = receipts.claims(CALL, Decision(outcome="approved"), decided_by="ann")
    return receipts.sign({**claims, **over})


def _refusal(receipts: Receipts, token: str, **call: Any) -> str:
    facts = {"request_id": "r1", "tool_name": "refund", "args": {"order": "A1"}, **call}
    with pytest.raises(ReceiptRefused) as refused:
        receipts.verify(token, **facts)
    return refused.value.reason


@pytest.fixture
def receipts(key: Path) -> Receipts:
    return Receipts(ReceiptKeys.load(key))


def test_each_bad_receipt_is_refused_with_its_reason(receipts: Receipts, tmp_path: Path) -> None:
    good = _signed(receipts)
    head, body, sig = good.split(".")
    flipped = sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")
    assert _refusal(receipts, f"{head}.{body}.{flipped}") == "bad_signature"
    assert _refusal(receipts, good, request_id="r2") == "other_request"
    assert _refusal(receipts, good, tool_name="delete_all") == "wrong_tool"
    assert _refusal(receipts, good, args={"order": "A9"}) == "args_changed"
    assert _refusal(receipts, _signed(receipts, exp=int(time.time()) - 60)) == "expired"
    assert _refusal(receipts, _signed(receipts, iss="someone")) == "wrong_issuer"
    assert _refusal(receipts, _signed(receipts, outcome="rejected")) == "wrong_outcome"
    assert _refusal(receipts, None) == "missing"
    assert _refusal(receipts, "not-a-jws") == "malformed"
    stranger = Receipts(ReceiptKeys.load(key_file(tmp_path, "stranger.pem")))
    assert _refusal(receipts, _signed(stranger)) == "unknown_key"


def test_a_rotated_key_verifies_until_it_is_dropped(key: Path, tmp_path: Path) -> None:
    old = Receipts(ReceiptKeys.load(key))
    signed_before = _signed(old)
    new_key = key_file(tmp_path, "new.pem")
    rotated = Receipts(ReceiptKeys.load(new_key, [key]))
    facts = {"request_id": "r1", "tool_name": "refund", "args": {"order": "A1"}}
    assert rotated.verify(signed_before, **facts)["sub"] == "r1"
    assert {k["kid"] for k in rotated.keys.jwks()["keys"]} == {old.keys.kid, rotated.keys.kid}
    assert rotated.verify(_signed(rotated), **facts)["sub"] == "r1"  # new ones, new kid
    dropped = Receipts(ReceiptKeys.load(new_key))
    assert _refusal(dropped, signed_before) == "unknown_key"


def test_receipts_are_off_without_a_key(redis: Any) -> None:
    broker = Broker(redis, parse_config({}), prefix="t:")
    made = broker.create_request(NewRequest(tool_name="refund"))
    decided = broker.decide(made.id, Decision(outcome="approved"), decided_by="ann")
    assert decided.decision is not None and decided.decision.receipt is None


def test_a_remembered_rule_gives_each_sibling_it_decides_its_own_receipt(
    redis: Any, key: Path
) -> None:
    broker = Broker(redis, parse_config(receipts_config(key)), prefix="t:")
    run_id = broker.create_run("refunds", "prompt").id
    calls = [NewRequest(tool_name="refund", args={"amount": n}) for n in (120, 80)]
    first, sibling = broker.create_round(run_id, 1, calls)
    ann = Principal("ann", frozenset({"finance"}))
    done = Judge(broker).decide(
        first.id, Decision(outcome="approved"), ann, via=("inbox",),
        remember={"tool": "refund", "run_id": run_id},
    )  # fmt: skip
    assert done.siblings == (sibling.id,)
    receipts = broker.store.receipts
    assert receipts is not None
    mine = broker.get_request(first.id).decision
    theirs = broker.get_request(sibling.id).decision
    assert mine is not None and theirs is not None
    facts = {"tool_name": "refund"}
    ann_claims = receipts.verify(mine.receipt, request_id=first.id, args={"amount": 120}, **facts)
    assert ann_claims["decided_by"] == "ann" and "rule" not in ann_claims
    rule_claims = receipts.verify(
        theirs.receipt, request_id=sibling.id, args={"amount": 80}, **facts
    )
    assert rule_claims["rule"] == done.rule.id and rule_claims["decided_by"] == f"rule:{done.rule.id}"  # type: ignore[union-attr]  # fmt: skip


def test_the_deciding_vote_read_before_another_vote_is_signed_for_the_votes_as_counted(
    redis: Any, key: Path
) -> None:
    raw = receipts_config(key)
    raw["queues"]["pair"] = {"channels": ["inbox"], "quorum": 2}
    broker = Broker(redis, parse_config(raw), prefix="t:")
    made = broker.create_request(NewRequest(tool_name="refund", queue="pair"))
    broker.decide(made.id, Decision(outcome="approved"), decided_by="ann")
    # bob's reply was judged on the request as read before ann's vote: the step tells the
    # signer who voted (need_votes), and the receipt names them both
    done = broker.decide(made.id, Decision(outcome="approved"), decided_by="bob", request=made)
    assert done.decision is not None and done.status.value == "approved"
    receipts = broker.store.receipts
    assert receipts is not None
    claims = receipts.verify(done.decision.receipt, request_id=made.id, tool_name="refund", args={})
    assert claims["quorum"] == {"required": 2, "votes": ["ann", "bob"]}


def test_up_makes_a_private_key_once_and_a_bad_key_file_stops_a_role(tmp_path: Path) -> None:
    made = private_key_file(tmp_path / "data" / "receipts-key.pem")
    assert made.stat().st_mode & 0o777 == 0o600
    first = made.read_bytes()
    assert private_key_file(made).read_bytes() == first  # kept, not made again
    ReceiptKeys.load(made)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    config = parse_config({"receipts": {"key_file": str(bad)}})
    with pytest.raises(ConfigError, match="receipts.key_file"):
        prepare_receipt_key(Settings(redis_url="redis://127.0.0.1:1/0"), config)
    elsewhere = parse_config({})
    prepare_receipt_key(Settings(redis_url="redis://127.0.0.1:1/0"), elsewhere)
    assert elsewhere.receipts.key_file is None  # a fleet without a key: receipts off


def test_only_the_one_who_asked_may_spend_a_receipt(client: TestClient) -> None:
    made = _create(client, args={"order": "A1"})
    client.post(
        f"/v1/requests/{made['id']}/decision", json={"outcome": "approved"}, headers=_auth("ann")
    )
    url = f"/v1/requests/{made['id']}/receipt/spend"
    body = {"tool_name": "refund", "args": {"order": "A1"}}
    assert client.post(url, json=body, headers=_auth("bob")).status_code == 403
    assert client.post(url, json=body, headers=_auth("app")).status_code == 200
