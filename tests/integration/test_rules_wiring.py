"""Policy rules wired into the broker, on a real Redis: a covered call is created already
decided (in the create step), a decision that remembers keeps its rule and decides the run's
covered siblings in the same step, a revoke racing a create never leaves half, and roles limit
what a remembered rule covers."""

from __future__ import annotations

import threading

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import Config
from broker.domain.errors import Conflict, Forbidden, InvalidInput
from broker.domain.models import Decision, NewRequest, Outcome, Status
from broker.domain.principals import Principal
from broker.facade import Broker
from broker.judge import Judge
from broker.redis.replies import as_str
from broker.rules import Call, parse_body, sync_at_start

CONFIG = {
    "queues": {"default": {"channels": ["inbox"]}},
    "agents": {"refunds": {"path": "refunds_demo:agent"}},
    "approvers": {
        "pat": {"roles": ["policy"]},
        "alice": {"roles": ["finance"]},
        "bob": {"roles": ["support"]},
    },
    "rules": [
        {
            "id": "no-big-wires",
            "effect": "deny",
            "tool": "wire*",
            "args": {"amount": {"gt": 10000}},
            "reason": "Wires over 10,000 need the treasury desk.",
        },
        {"id": "lookups", "effect": "allow", "tool": "lookup"},
    ],
}
PAT = Principal("pat", frozenset({"policy"}))
ALICE = Principal("alice", frozenset({"finance"}))
BOB = Principal("bob", frozenset({"support"}))


API_CONFIG = CONFIG


@pytest.fixture(params=["single", "cluster"])
def rb(request: pytest.FixtureRequest, cfg: Config) -> Broker:
    """A broker on a single Redis or on the local Redis Cluster (issue 19: rules work on both)."""
    if request.param == "single":
        client: Redis | RedisCluster = request.getfixturevalue("redis")
    else:
        client = request.getfixturevalue("cluster_client")
    broker = Broker(client, cfg, prefix="t:")
    sync_at_start(broker.requests.rules)
    return broker


def stream_types(broker: Broker, queue: str = "default") -> list[tuple[str, str, str]]:
    """The queue's events in order (on a cluster, every partition's stream, merged by id)."""
    found = []
    for keys in broker.keys.parts():
        found += broker.redis.xrange(keys.stream(queue))
    out = []
    for _, fields in sorted(found, key=lambda e: tuple(int(x) for x in e[0].split(b"-"))):
        f = {as_str(k): as_str(v) for k, v in fields.items()}
        out.append((f["type"], f["request_id"], f.get("ruled_at_create", "")))
    return out


def new_run(broker: Broker, agent: str = "refunds") -> str:
    return broker.create_run(agent, "prompt").id


def resumes(broker: Broker) -> list[dict[str, str]]:
    return [
        {as_str(k): as_str(v) for k, v in f.items()}
        for keys in broker.keys.parts()
        for _, f in broker.redis.xrange(keys.resumes)
    ]


def test_a_config_deny_decides_at_create_and_no_person_is_asked(rb: Broker) -> None:
    wire = rb.create_request(NewRequest(tool_name="wire_out", args={"amount": 20000}))
    small = rb.create_request(NewRequest(tool_name="wire_out", args={"amount": 10}))
    assert wire.status is Status.rejected
    assert wire.decision is not None
    assert wire.decision.decided_by == "rule:no-big-wires" and wire.decision.rule == "no-big-wires"
    assert wire.decision.reason == "Wires over 10,000 need the treasury desk."
    assert wire.decision.decided_at == wire.created_at
    [entry] = wire.history
    assert (entry.event, entry.rule, entry.by) == ("decided_by_rule", "no-big-wires", "rule:no-big-wires")  # fmt: skip
    assert small.status is Status.pending
    assert stream_types(rb) == [
        ("approval.decided", wire.id, "1"),
        ("approval.requested", small.id, ""),
    ]
    assert rb.counts() == {"rejected:default": 1, "pending:default": 1}
    assert rb.redis.zscore(rb.keys.of_request(wire.id).expiry, wire.id) is None
    assert [r.id for r in rb.list_requests(status="rejected")] == [wire.id]  # listed as decided
    assert [r.id for r in rb.list_requests(status="pending")] == [small.id]
    rule = rb.requests.rules.get("no-big-wires")
    assert rule.hits == 1 and rule.last_hit_at is not None
    assert rb.redis.hgetall(rb.keys.rules.hits) == {b"deny:no-big-wires": b"1"}


def test_rules_decide_only_approvals(rb: Broker) -> None:
    question = rb.create_request(NewRequest(tool_name="lookup", kind="question"))
    assert question.status is Status.pending and question.suggested_rules == []


def test_an_approval_carries_suggested_rules(rb: Broker) -> None:
    run_id = new_run(rb)
    [request] = rb.create_round(
        run_id, 1, [NewRequest(tool_name="refund", args={"order": "A1", "amount": 120})]
    )
    assert request.suggested_rules == [
        {"effect": "allow", "tool": "refund", "run_id": run_id},
        {"effect": "allow", "tool": "refund", "agent": "refunds"},
        {"effect": "allow", "tool": "refund", "agent": "refunds", "args": {"amount": {"le": 120}}},
    ]
    assert rb.get_request(request.id).suggested_rules == request.suggested_rules


def test_a_round_decided_entirely_by_rules_resumes_at_once(rb: Broker) -> None:
    run_id = new_run(rb)
    calls = [NewRequest(tool_name="lookup"), NewRequest(tool_name="wire", args={"amount": 1e6})]
    made = rb.create_round(run_id, 1, calls)
    assert [r.status for r in made] == [Status.approved, Status.rejected]
    assert resumes(rb) == [{"run_id": run_id, "round": "1"}]
    assert rb.get_run(run_id).status.value == "queued"
    assert rb.create_round(run_id, 1, calls)[0].id == made[0].id  # a retried job: no new resume
    assert len(resumes(rb)) == 1


def decide_remembering(
    broker: Broker, request_id: str, principal: Principal, remember, outcome=Outcome.approved
):
    return Judge(broker).decide(
        request_id, Decision(outcome=outcome), principal, via=("inbox",), remember=remember
    )


def three_call_round(broker: Broker) -> tuple[str, list]:
    run_id = new_run(broker)
    calls = [
        NewRequest(tool_name="refund", args={"amount": 120}),
        NewRequest(tool_name="refund", args={"amount": 80}),
        NewRequest(tool_name="ship", args={"order": "A1"}),
    ]
    return run_id, broker.create_round(run_id, 1, calls)


def test_remembering_decides_the_covered_sibling_in_the_same_step(rb: Broker) -> None:
    run_id, (a, b, c) = three_call_round(rb)
    done = decide_remembering(rb, a.id, ALICE, 0)  # "this tool, this run"
    assert done.recorded and done.request.status is Status.approved
    assert done.rule is not None and done.rule.run_id == run_id
    assert done.rule.created_by == "alice" and done.rule.from_request == a.id
    assert done.rule.creator_roles == ["finance"] and done.rule.hits == 1
    assert done.siblings == (b.id,)
    sibling = rb.get_request(b.id)
    assert sibling.decision is not None and sibling.decision.rule == done.rule.id
    assert sibling.history[-1].event == "decided_by_rule"
    assert rb.get_request(a.id).history[-1].rule == done.rule.id
    assert rb.get_request(c.id).status is Status.pending
    assert resumes(rb) == []
    rb.decide(c.id, Decision(outcome=Outcome.approved), decided_by="bob")
    assert resumes(rb) == [{"run_id": run_id, "round": "1"}]
    # a later round's covered call is decided at create, with no person
    [later] = rb.create_round(run_id, 2, [NewRequest(tool_name="refund", args={"amount": 5})])
    assert later.decision is not None and later.decision.rule == done.rule.id
    assert len(resumes(rb)) == 2


def at_once(*steps) -> list[BaseException]:
    """Run the steps in real threads released together; the errors they raised."""
    barrier = threading.Barrier(len(steps))
    errors: list[BaseException] = []

    def run(step) -> None:
        barrier.wait()
        try:
            step()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(step,)) for step in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_remember_racing_a_person_on_a_third_sibling_resumes_once(rb: Broker) -> None:
    for _ in range(15):
        run_id, (a, b, c) = three_call_round(rb)
        errors = at_once(
            lambda a=a: decide_remembering(rb, a.id, ALICE, 0),
            lambda c=c: rb.decide(c.id, Decision(outcome=Outcome.rejected), decided_by="bob"),
        )
        assert errors == []
        assert [r.status for r in rb.get_requests([a.id, b.id, c.id])] == [
            Status.approved,
            Status.approved,
            Status.rejected,
        ]
        assert [e for e in resumes(rb) if e["run_id"] == run_id] == [
            {"run_id": run_id, "round": "1"}
        ]


def test_a_revoke_racing_a_create_leaves_one_outcome_never_half(rb: Broker) -> None:
    store = rb.requests.rules
    seen = set()
    for i in range(30):
        rule = store.create(parse_body({"effect": "allow", "tool": f"race{i}"}), created_by="pat")
        made = []
        errors = at_once(
            lambda i=i, made=made: made.append(rb.create_request(NewRequest(tool_name=f"race{i}"))),
            lambda rule=rule: store.revoke(rule.id),
        )
        assert errors == []
        [request] = made
        stored = rb.get_request(request.id)
        hits = store.get(rule.id).hits
        seen.add(stored.status)
        if stored.status is Status.approved:
            assert stored.decision is not None and stored.decision.rule == rule.id and hits == 1
        else:
            assert stored.status is Status.pending and stored.decision is None and hits == 0
            assert rb.redis.zscore(rb.keys.of_request(request.id).expiry, request.id) is not None
        assert store.get(rule.id).revoked_at is not None
    assert seen <= {Status.approved, Status.pending}


def test_roles_limit_a_remembered_rule(rb: Broker) -> None:
    run_id = new_run(rb)
    calls = [
        NewRequest(tool_name="refund", args={"amount": 1}, allowed_roles=["finance"]),
        NewRequest(tool_name="refund", args={"amount": 2}, allowed_roles=["support"]),
        NewRequest(tool_name="refund", args={"amount": 3}),
    ]
    a, b, c = rb.create_round(run_id, 1, calls)
    with pytest.raises(Forbidden):  # not scoped to a run or an agent
        decide_remembering(rb, a.id, ALICE, {"tool": "refund"})
    with pytest.raises(Forbidden):  # bob may not decide a (finance only)
        decide_remembering(rb, a.id, BOB, 0)
    assert rb.get_request(a.id).status is Status.pending
    done = decide_remembering(rb, a.id, ALICE, 1)  # this tool, this agent
    assert done.siblings == (c.id,)  # not b: its allowed_roles alice doesn't hold
    assert rb.get_request(b.id).status is Status.pending
    # role policy may keep an unscoped rule, and its rule covers any request
    other = new_run(rb)
    d, e = rb.create_round(
        other,
        1,
        [
            NewRequest(tool_name="ship", allowed_roles=["finance"]),
            NewRequest(tool_name="ship", allowed_roles=["support"]),
        ],
    )
    lead = Principal("pat", frozenset({"policy", "finance"}))
    done = decide_remembering(rb, d.id, lead, {"tool": "ship"})
    assert done.rule is not None and done.rule.creator_roles is None
    assert done.siblings == (e.id,)


def test_remember_refuses_other_outcomes_and_bad_bodies_writing_nothing(rb: Broker) -> None:
    _, (a, _, _) = three_call_round(rb)
    before = rb.redis.zcard(rb.keys.rules.listing)
    for outcome, remember in [
        (Outcome.escalated, 0),
        (Outcome.approved, 7),
        (Outcome.approved, {"tool": "refund", "run_id": "r", "args": {"x": {"between": 1}}}),
        (Outcome.approved, {"tool": "refund", "run_id": "r", "effect": "deny"}),
    ]:
        with pytest.raises(InvalidInput) as exc:
            decide_remembering(rb, a.id, ALICE, remember, outcome)
        assert exc.value.code == "invalid_rule"
    assert rb.redis.zcard(rb.keys.rules.listing) == before
    assert rb.get_request(a.id).status is Status.pending


def test_rejecting_remembers_a_deny_whose_reason_the_model_is_told(rb: Broker) -> None:
    run_id, (a, b, _) = three_call_round(rb)
    done = Judge(rb).decide(
        a.id,
        Decision(outcome=Outcome.rejected, reason="no refunds in this run"),
        ALICE,
        via=("inbox",),
        remember=0,
    )
    assert done.rule is not None and done.rule.effect == "deny"
    assert done.rule.reason == "no refunds in this run"
    sibling = rb.get_request(b.id)
    assert sibling.status is Status.rejected
    assert sibling.decision is not None and sibling.decision.reason == "no refunds in this run"
    # a second remember on the decided request: as any decision, who won
    with pytest.raises(Conflict):
        decide_remembering(rb, a.id, PAT, 0)


def test_a_request_needing_more_votes_is_decided_only_by_a_policy_bypass_rule(rb: Broker) -> None:
    store = rb.requests.rules
    ordinary = store.create(
        parse_body({"effect": "allow", "tool": "pay", "agent": "refunds"}),
        created_by="alice",
        creator_roles=["finance"],
    )
    call = Call("pay", agent="refunds")
    assert store.match(call)[1].id == ordinary.id
    assert store.match(call, quorum=2) is None
    bypass = store.create(
        parse_body({"effect": "allow", "tool": "pay", "quorum_bypass": True}), created_by="pat"
    )
    assert store.match(call, quorum=2)[1].id == bypass.id
