"""The audit trail on a real Redis: a step appends its entry bare and sealing adds `prev` and
`hash` (hashlib, off Redis's thread; the sweeper, any reader, concurrent sealers, a chain from
before sealing), every state change appends an entry in the step that makes it (created, voted,
decided, escalated, timed out, rule created and revoked, a rule's decision, a remembered rule
and its siblings), the chain verifies, the trail is off when `[audit] enabled = false`, and
`GET /v1/audit` is for role `auditor` only, in pages."""

from __future__ import annotations

import hashlib
import threading
import time

from redis import Redis

from broker.audit import FIELDS, AuditTrail, canonical, entry_hash, verify
from broker.audit.sealing import seal
from broker.audit.trail import append_entry
from broker.domain.config import Config, parse_config
from broker.domain.models import Decision, NewRequest, args_hash
from broker.domain.principals import Principal
from broker.facade import Broker
from broker.judge import Judge
from broker.rules import parse_body
from notifiers.commit import Committer
from notifiers.parking import ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from tests.support.auth import person
from tests.support.outbox_entries import pending_entry
from tests.support.waiting import wait_for
from workers.sweeper import sweep_forever

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


def test_a_step_appends_its_entry_unhashed_and_the_sealer_hashes_it_with_hashlib(
    redis: Redis, cfg: Config
) -> None:
    """No hash runs inside Redis: the entry goes in bare, its `prev` and `hash` come from
    sealing (hashlib, in the sweeper or a reader) into the seals stream under the same id."""
    broker = Broker(redis, cfg, prefix="t:")
    a = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}))
    broker.decide(a.id, Decision(outcome="approved"), decided_by="alice")
    chain = AuditTrail(redis, broker.keys).chains[0]
    rows = redis.xrange(chain.stream)
    assert [sorted(f) for _, f in rows] == [sorted(f.encode() for f in FIELDS[:-1])] * 2
    assert redis.exists(chain.seals) == 0 and redis.hget(chain.head, "seq") == b"2"
    assert AuditTrail(redis, broker.keys).seal() == 2
    seals = redis.xrange(chain.seals)
    assert [i for i, _ in seals] == [i for i, _ in rows]
    prev = ""
    for (_, fields), (_, sealed) in zip(rows, seals, strict=True):
        values = {k.decode(): v.decode() for k, v in fields.items()} | {"prev": prev}
        digest = hashlib.sha256(canonical(values)).hexdigest()
        assert sealed == {b"prev": prev.encode(), b"hash": digest.encode()}
        prev = digest
    assert redis.hmget(chain.head, ["sealed", "sealed_id", "hash"]) == [
        b"2",
        rows[-1][0],
        prev.encode(),
    ]
    assert AuditTrail(redis, broker.keys).seal() == 0  # nothing new: nothing written


def test_a_read_seals_what_the_sweeper_has_not_yet(redis: Redis, cfg: Config) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    for n in range(3):
        broker.create_request(NewRequest(tool_name="refund", args={"n": n}))
    trail = AuditTrail(redis, broker.keys)
    first, cursor = trail.page(None, None, 2)
    assert [e.seq for e in first] == [1, 2] and all(e.hash for e in first)
    broker.create_request(NewRequest(tool_name="refund", args={"n": 3}))
    rest, _ = trail.page(None, cursor, 10)
    assert [e.seq for e in rest] == [3, 4] and rest[0].prev == first[1].hash
    assert verify(list(enumerate([*first, *rest], 1))) == (None, {"main": 4})
    assert trail.heads() == {"main": (4, rest[-1].hash)}


def test_concurrent_sealers_and_steps_make_one_chain(redis: Redis, cfg: Config) -> None:
    """Four sealing threads race four creating threads: every entry is sealed once, and the
    chain verifies (a sealer that lost a race read again instead of storing a second hash)."""
    broker = Broker(redis, cfg, prefix="t:")
    trail = AuditTrail(redis, broker.keys)
    creating = threading.Barrier(8)
    sealed_counts: list[int] = []

    def create(n: int) -> None:
        creating.wait()
        for i in range(50):
            broker.create_request(NewRequest(tool_name="refund", args={"n": n, "i": i}))

    def sealer() -> None:
        creating.wait()
        sealed_counts.append(sum(seal(redis, trail.chains[0], batch=7) for _ in range(40)))

    threads = [threading.Thread(target=create, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=sealer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sealed_counts.append(trail.seal())
    entries = trail_of(broker)
    assert sum(sealed_counts) == len(entries) == 200
    assert redis.xlen(trail.chains[0].seals) == 200
    assert verify(list(enumerate(entries, 1))) == (None, {"main": 200})


def test_a_chain_hashed_in_its_steps_before_sealing_carries_on(redis: Redis, cfg: Config) -> None:
    """A chain written before this version (each entry with its own `prev` and `hash`, the
    head holding the last `seq` and `hash`): the next entries are sealed onto it and the whole
    chain verifies, old entries and new."""
    broker = Broker(redis, cfg, prefix="t:")
    chain = AuditTrail(redis, broker.keys).chains[0]
    prev = ""
    for seq in (1, 2):
        values = {"seq": str(seq), "at": f"2026-12-0{seq}T00:00:00.000000Z", "event": "created",
                  "actor_kind": "system", "request_id": f"req_old{seq}", "prev": prev}  # fmt: skip
        prev = entry_hash(values)
        redis.xadd(chain.stream, {**values, "hash": prev})
    redis.hset(chain.head, mapping={"seq": 2, "hash": prev})
    broker.create_request(NewRequest(tool_name="refund", args={}))
    entries = trail_of(broker)
    assert [(e.seq, e.request_id.startswith("req_old")) for e in entries] == [
        (1, True),
        (2, True),
        (3, False),
    ]
    assert entries[2].prev == prev and redis.xlen(chain.seals) == 1
    assert verify(list(enumerate(entries, 1))) == (None, {"main": 3})


def test_the_sweeper_seals_the_trail(redis: Redis, cfg: Config) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    broker.create_request(NewRequest(tool_name="refund", args={}))
    chain = AuditTrail(redis, broker.keys).chains[0]
    stop = threading.Event()
    thread = threading.Thread(target=sweep_forever, args=(broker, stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: redis.xlen(chain.seals) == 1)
        broker.create_request(NewRequest(tool_name="refund", args={"n": 2}))
        wait_for(lambda: redis.xlen(chain.seals) == 2)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert redis.hget(chain.head, "sealed") == b"2"


def test_seals_are_trimmed_with_the_entries(redis: Redis, cfg: Config) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    for n in range(3):
        broker.create_request(NewRequest(tool_name="refund", args={"n": n}))
    trail = AuditTrail(redis, broker.keys)
    trail.seal()
    chain = trail.chains[0]
    oldest_two = [i for i, _ in redis.xrange(chain.stream, count=2)]
    redis.xdel(chain.stream, *oldest_two)  # as retention trims them
    broker.create_request(NewRequest(tool_name="refund", args={"n": 3}))
    trail.seal()
    assert [i for i, _ in redis.xrange(chain.seals)] == [i for i, _ in redis.xrange(chain.stream)]
    entries = trail_of(broker)
    assert [e.seq for e in entries] == [3, 4]
    assert verify(list(enumerate(entries, 1))) == (None, {"main": 2})  # anchored at seq 3


def test_each_state_change_appends_one_entry_in_its_step(redis: Redis, cfg: Config) -> None:
    broker = Broker(redis, cfg, prefix="t:")
    a = broker.create_request(NewRequest(tool_name="refund", args={"amount": 5}, created_by="svc"))
    broker.decide(a.id, Decision(outcome="modified", args={"amount": 4}), decided_by="alice")
    b = broker.create_request(NewRequest(tool_name="refund", args={"amount": 6}))
    broker.escalate(b.id, "managers", decided_by="bob")
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
    done = Judge(broker).decide(
        one.id, Decision(outcome="approved"), Principal("pat", frozenset({"policy"})),
        via={"inbox"}, remember={"tool": "refund", "run_id": run_id},
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
