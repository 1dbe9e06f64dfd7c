"""The audit trail on a real Redis: the Lua SHA-256 agrees with hashlib, every state change
appends an entry in the step that makes it (created, voted, decided, escalated, timed out,
rule created and revoked, a rule's decision, a remembered rule and its siblings), the chain
verifies, the trail is off when `[audit] enabled = false`, and `GET /v1/audit` is for role
`auditor` only, in pages."""

from __future__ import annotations

import hashlib
import time

from redis import Redis

from broker.audit import AuditTrail, entry_hash, verify
from broker.audit.trail import append_entry
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, NewRequest, args_hash
from broker.domain.principals import Principal
from broker.facade import Broker
from broker.judge.deciding import Deciding
from broker.judge.rule_decisions import RuleDecisions
from broker.rules import parse_body
from broker.store.scripts import source
from notifiers.commit import Committer
from notifiers.parking import ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from tests.support.auth import person
from tests.support.outbox_entries import pending_entry
from tests.support.waiting import wait_for

RAW = {
    "queues": {
        "default": {"channels": ["inbox"], "timeout_s": 600, "escalate_to": "managers"},
        "managers": {"channels": ["inbox"], "timeout_s": 1800},
        "pair": {"channels": ["inbox"], "quorum": 2},
    },
    "agents": {"refunds": {"path": "refunds_demo:agent"}},
    "approvers": {
        "alice": person("tok-alice", ["finance"]),
        "bob": person("tok-bob", ["finance"]),
        "pat": person("tok-pat", ["policy"]),
        "audrey": person("tok-audrey", ["auditor"]),
    },
}


API_CONFIG = RAW


def trail_of(broker: Broker) -> list:
    return list(AuditTrail(broker.redis, broker.keys).entries())


def events(broker: Broker) -> list[tuple[str, str, str, str, str]]:
    return [(e.request_id, e.event, e.actor, e.actor_kind, e.outcome) for e in trail_of(broker)]


def test_the_lua_sha256_agrees_with_hashlib(redis: Redis) -> None:
    script = redis.register_script(
        source("audit").split("\nlocal A = ")[0] + "\nreturn sha256(ARGV[1])"
    )
    for n in (*range(0, 200), 1000, 5000):  # every padding case, one to several blocks
        text = ("é" * n)[:n] if n % 2 else "x" * n
        assert script(args=[text]).decode() == hashlib.sha256(text.encode()).hexdigest(), n
    raw = bytes(range(256)) * 3  # every byte value, the high ones as struct reads them
    for n in (1, 63, 64, 65, 255, 256, 768):
        assert script(args=[raw[:n]]).decode() == hashlib.sha256(raw[:n]).hexdigest(), n


def test_each_state_change_appends_one_entry_in_its_step(redis: Redis, cfg: Config) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    a = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}, created_by="svc"))
    broker.decide(a.id, Decision(outcome="modified", args={"amount": 4}), decided_by="alice")
    b = broker.create_request(NewRequest(tool_name="refund", args={"amount": 6}))
    broker.escalate(b.id, "managers", by="bob")
    c = broker.create_request(NewRequest(tool_name="refund", args={"amount": 7}, queue="pair"))
    broker.decide(c.id, Decision(outcome="approved"), decided_by="alice")
    broker.decide(c.id, Decision(outcome="approved"), decided_by="webhook:ops/bob")
    d = broker.create_request(NewRequest(tool_name="refund", args={"amount": 8}))
    broker.sweep(now=time.time() + 700)  # d escalates to managers
    broker.sweep(now=time.time() + 700 + 1900)  # then times out (so does b)
    assert events(broker) == [
        (a.id, "created", "svc", "person", ""),
        (a.id, "decided", "alice", "person", "modified"),
        (b.id, "created", "", "system", ""),
        (b.id, "escalated", "bob", "person", ""),
        (c.id, "created", "", "system", ""),
        (c.id, "voted", "alice", "person", "approved"),
        (c.id, "decided", "webhook:ops/bob", "webhook", "approved"),
        (d.id, "created", "", "system", ""),
        (d.id, "escalated", "sweeper", "system", ""),
        (b.id, "timed_out", "sweeper", "system", "timed_out"),
        (d.id, "timed_out", "sweeper", "system", "timed_out"),
    ]
    entries = trail_of(broker)
    assert entries[1].args_hash == args_hash({"amount": 4})  # the args to run, when modified
    assert entries[0].args_hash == args_hash({"amount": 5})
    assert [e.seq for e in entries] == list(range(1, 12))
    assert all(e.prev == p.hash for p, e in zip(entries, entries[1:], strict=False))
    assert all(entry_hash(e.model_dump()) == e.hash for e in entries)
    assert verify(list(enumerate(entries, 1))) == (None, {"main": 11})


def test_rules_their_decisions_and_a_remember_are_in_the_trail(redis: Redis, cfg: Config) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    rules = broker.requests.rules
    rules.create(
        parse_body({"id": "deny-wipe", "effect": "deny", "tool": "wipe"}), created_by="pat"
    )
    ruled = broker.create_request(NewRequest(tool_name="wipe", args={}))
    rules.revoke("deny-wipe", by="pat")
    run_id = broker.create_run("refunds", "p").id
    one, two = broker.create_round(
        run_id, 1, [NewRequest(tool_name="refund", args={"amount": n}) for n in (1, 2)]
    )
    done = RuleDecisions(Deciding(broker)).decide(
        one.id, Decision(outcome="approved"), Principal("pat", frozenset({"policy"})),
        {"tool": "refund", "run_id": run_id}, via={"inbox"},
    )  # fmt: skip
    rule_id = done.rule.id
    got = events(broker)
    assert got[:4] == [
        ("", "rule_created", "pat", "person", "deny"),
        (ruled.id, "created", "", "system", ""),
        (ruled.id, "decided", "rule:deny-wipe", "rule", "rejected"),
        ("", "rule_revoked", "pat", "person", "deny"),
    ]
    assert got[4:6] == [
        (one.id, "created", "agent:refunds", "system", ""),
        (two.id, "created", "agent:refunds", "system", ""),
    ]
    assert got[6:] == [
        (one.id, "rule_created", "pat", "person", "allow"),
        (one.id, "decided", "pat", "person", "approved"),
        (two.id, "decided", f"rule:{rule_id}", "rule", "approved"),
    ]
    assert verify(list(enumerate(trail_of(broker), 1)))[0] is None


def test_an_entry_appended_from_python_joins_the_chain(redis: Redis, cfg: Config) -> None:
    """The way in for changes made outside the Lua steps (receipts: spent or refused)."""
    broker = Broker(redis, cfg, prefix="t:")
    a = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    keys = broker.keys.of_request(a.id)
    pipe = redis.pipeline(transaction=True)
    pipe.set("t:something", "1")
    append_entry(
        redis, keys.audit, keys.audit_head, event="receipt_refused", actor="worker",
        request_id=a.id, outcome="bad_signature", keep_s=keys.audit_keep_s, client=pipe,
    )  # fmt: skip
    pipe.execute()
    entries = trail_of(broker)
    assert [(e.seq, e.event) for e in entries] == [(1, "created"), (2, "receipt_refused")]
    assert verify(list(enumerate(entries, 1)))[0] is None


def test_the_trail_is_off_when_disabled(redis: Redis) -> None:
    broker = Broker(redis, parse_config({**RAW, "audit": {"enabled": False}}), prefix="t:")
    a = broker.create_request(NewRequest(tool_name="refund", args={}))
    broker.decide(a.id, Decision(outcome="approved"), decided_by="alice")
    assert trail_of(broker) == [] and redis.exists(broker.keys.audit) == 0


def test_get_audit_is_for_auditors_in_pages(client, api_broker: Broker) -> None:
    for n in range(3):
        api_broker.create_request(NewRequest(tool_name="refund", args={"n": n}))
    refused = client.get("/v1/audit", headers={"Authorization": "Bearer tok-alice"})
    assert refused.status_code == 403 and refused.json()["error"]
    auditor = {"Authorization": "Bearer tok-audrey"}
    first = client.get("/v1/audit?limit=2", headers=auditor)
    assert first.status_code == 200 and [e["seq"] for e in first.json()] == [1, 2]
    second = client.get(first.headers["Link"].split(">")[0].lstrip("<"), headers=auditor)
    assert [e["seq"] for e in second.json()] == [3] and "Link" not in second.headers
    bad = client.get("/v1/audit?cursor=nonsense", headers=auditor)
    assert bad.status_code == 422 and bad.json()["error"] == "bad_cursor"
    later = client.get("/v1/audit?since=2999-01-01T00:00:00Z", headers=auditor)
    assert later.json() == []
    before_1970 = client.get("/v1/audit?since=1969-01-01T00:00:00Z", headers=auditor)
    assert before_1970.status_code == 200 and len(before_1970.json()) == 3  # from the start


def test_deliveries_are_in_the_trail_from_the_committer_and_the_note_step(
    redis: Redis, cfg: Config
) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    a = broker.create_request(NewRequest(tool_name="refund", args={"n": 1}))
    committer = Committer(broker, lambda _: None, ParkedStore(broker, lease_s=30), print)
    try:
        entry = pending_entry(broker, a.id)
        committer.put(DeliveryResult(entry, ResultKind.delivered, "webhook:a", "webhook", "204"))
        wait_for(lambda: len(trail_of(broker)) == 2)
    finally:
        committer.close()
    note = '{"at":"2026-12-01T00:00:00Z","event":"delivery_failed","channel":"slack:ops"}'
    broker.requests.add_delivery_note(a.id, note)  # the pipeline path (cluster, parked)
    assert events(broker) == [
        (a.id, "created", "", "system", ""),
        (a.id, "delivered", "webhook:a", "system", ""),
        (a.id, "delivery_failed", "slack:ops", "system", ""),
    ]
    assert verify(list(enumerate(trail_of(broker), 1)))[0] is None
