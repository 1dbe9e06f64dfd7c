"""First decision wins, a round resumes once, and bad decisions write nothing (Guarantees 1, 2, 6)."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from broker.domain.args_hash import args_hash
from broker.domain.errors import Conflict, InvalidInput, NotFound
from broker.domain.models import Decision, NewRequest, Status
from broker.facade import Broker
from tests.support.backends import on_backend, on_backend_broker, single_only  # noqa: F401 - redis and broker on both backends
from tests.support.decisions import race, snapshot  # noqa: F401


def test_fifty_threads_one_winner(broker: Broker, new_redis, config):
    request = broker.create_request(
        NewRequest(tool_name="refund", args={"order": "A1", "amount": 120})
    )

    def decide(i: int):
        own = Broker(new_redis(), config, prefix="t:")
        outcome = "approved" if i % 2 else "rejected"
        return own.decide(
            request.id, Decision(outcome=outcome, reason=f"r{i}"), decided_by=f"user{i}"
        )

    results = race(50, decide)
    wins = [r for r in results if not isinstance(r, Exception)]
    conflicts = [r for r in results if isinstance(r, Conflict)]
    assert len(wins) == 1 and len(conflicts) == 49
    winner = wins[0].decision
    assert {c.request.decision.decided_by for c in conflicts} == {winner.decided_by}
    stored = broker.get_request(request.id)
    assert stored.decision.decided_by == winner.decided_by
    assert stored.status.value == winner.outcome.value
    keys = broker.keys.of_request(request.id)  # its partition's (one on a single Redis)
    events = broker.redis.xrange(keys.stream("default"))
    assert [e[1][b"type"] for e in events] == [b"approval.requested", b"approval.decided"]
    assert broker.redis.zscore(keys.expiry, request.id) is None


def test_decision_racing_the_sweeper_leaves_one_outcome(broker: Broker, new_redis, config):
    """Many iterations of a decide and a sweep released together: exactly one outcome each time.

    Both outcomes must occur (else the race was never run: it goes on past 150 rounds, up to
    1,000, until each side has won once), and each request gets exactly one outcome event in its
    stream, whichever side won. The decision sets off up to 2 ms after the sweep, a different
    offset each round: on a loaded machine (a cluster's extra hops) one side took every one of
    1,000 rounds released at exactly the same moment, and the race went untested.
    """
    broker.config.queues["default"].escalate_to = None  # time out instead of escalating
    other = Broker(new_redis(), config, prefix="t:")
    outcomes = {"approved": 0, "timed_out": 0}
    ids: list[str] = []
    i = 0
    while i < 150 or (min(outcomes.values()) == 0 and i < 1000):
        i += 1
        request = broker.create_request(NewRequest(tool_name="t", args={"i": i}, timeout_s=0.001))
        ids.append(request.id)
        due = time.time() + 1

        def act(which: int, rid: str = request.id, due: float = due, late: float = (i % 9) / 4000):
            if which == 0:
                time.sleep(late)  # not a wait for the other side: where in its step it starts
                return broker.decide(rid, Decision(outcome="approved"), decided_by="alice")
            return other.sweep(now=due)

        decided, swept = race(2, act)
        stored = broker.get_request(request.id)
        assert stored.status in (Status.approved, Status.timed_out)
        outcomes[stored.status.value] += 1
        if stored.status is Status.approved:
            assert not isinstance(decided, Exception)
            assert all(s.request_id != request.id for s in swept)
            assert stored.decision.decided_by == "alice"
        else:
            assert isinstance(decided, Conflict)
            assert decided.request.status is Status.timed_out
            assert [s.action for s in swept if s.request_id == request.id] == ["timed_out"]
            assert stored.decision.decided_by == "sweeper"
    assert outcomes["approved"] > 0 and outcomes["timed_out"] > 0, outcomes
    per_request: dict[str, list[bytes]] = {rid: [] for rid in ids}
    events = [e for k in broker.keys.parts() for e in broker.redis.xrange(k.stream("default"))]
    for _, fields in events:
        if fields[b"type"] in (b"approval.decided", b"approval.timed_out"):
            per_request[fields[b"request_id"].decode()].append(fields[b"type"])
    expected = {b"approved": b"approval.decided", b"timed_out": b"approval.timed_out"}
    for rid, kinds in per_request.items():
        status = broker.get_request(rid).status.value.encode()
        assert kinds == [expected[status]], (rid, status, kinds)


def test_three_calls_decided_at_once_write_one_outbox_entry(broker: Broker, new_redis, config):
    for attempt in range(20):
        run_id = f"run_{attempt}"
        broker.create_run("agent", "go", run_id=run_id)
        calls = [
            NewRequest(tool_name=f"tool{i}", args={"i": i}, tool_call_id=f"c{i}") for i in range(3)
        ]
        requests = broker.create_round(run_id, 1, calls)
        assert broker.get_run(run_id).status.value == "waiting"
        clients = [Broker(new_redis(), config, prefix="t:") for _ in range(3)]
        race(
            3,
            lambda i, rs=requests, cs=clients: cs[i].decide(
                rs[i].id, Decision(outcome="approved"), decided_by="a"
            ),
        )
        entries = [
            e
            for e in broker.redis.xrange(broker.keys.of_run(run_id).resumes)
            if e[1][b"run_id"] == run_id.encode()
        ]
        assert len(entries) == 1
        assert entries[0][1][b"round"] == b"1"
        assert broker.get_run(run_id).status.value == "queued"
        assert broker.get_run(run_id).pending == []


def test_outbox_waits_for_every_call_of_the_round(broker: Broker):
    broker.create_run("agent", "go", run_id="r1")
    a, b = broker.create_round(
        "r1", 1, [NewRequest(tool_name="x"), NewRequest(tool_name="y", kind="question")]
    )
    broker.decide(a.id, Decision(outcome="rejected", reason="no"), decided_by="bob")
    resumes = broker.keys.of_run("r1").resumes
    assert broker.redis.xlen(resumes) == 0
    assert broker.get_run("r1").pending == [b.id]
    broker.decide(b.id, Decision(outcome="answered", answer={"colour": "blue"}), decided_by="bob")
    assert broker.redis.xlen(resumes) == 1


def test_registering_a_round_twice_creates_nothing_new(broker: Broker):
    broker.create_run("agent", "go", run_id="r2")
    first = broker.create_round("r2", 1, [NewRequest(tool_name="x")])
    again = broker.create_round("r2", 1, [NewRequest(tool_name="x")])
    assert [r.id for r in again] == [r.id for r in first]
    assert broker.redis.xlen(broker.keys.of_run("r2").stream("default")) == 1


def test_stale_args_hash_is_refused_and_writes_nothing(broker: Broker):
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 100}))
    before = snapshot(broker.redis)
    with pytest.raises(InvalidInput) as info:
        broker.decide(
            request.id,
            Decision(outcome="approved", args_hash=args_hash({"amount": 999})),
            decided_by="a",
        )
    assert info.value.code == "stale_args"
    assert snapshot(broker.redis) == before
    ok = broker.decide(
        request.id, Decision(outcome="approved", args_hash=request.args_hash), decided_by="a"
    )
    assert ok.status is Status.approved


def test_modified_records_new_args(broker: Broker):
    request = broker.create_request(NewRequest(tool_name="refund", args={"amount": 100}))
    done = broker.decide(
        request.id, Decision(outcome="modified", args={"amount": 50}), decided_by="a"
    )
    assert done.status is Status.modified and done.decision.args == {"amount": 50}
    assert done.args == {"amount": 100}  # what the agent asked stays on record


@pytest.mark.parametrize(
    ("kind", "decision", "code"),
    [
        ("approval", {"outcome": "answered", "answer": 1}, "wrong_kind"),
        ("question", {"outcome": "approved"}, "wrong_kind"),
        ("external", {"outcome": "modified", "args": {"a": 1}}, "wrong_kind"),
        ("approval", {"outcome": "escalated", "target": "nowhere"}, "unknown_queue"),
        ("approval", {"outcome": "timed_out"}, "invalid"),
    ],
)
def test_impossible_decisions_write_nothing(broker: Broker, kind, decision, code):
    request = broker.create_request(NewRequest(tool_name="t", kind=kind))
    before = snapshot(broker.redis)
    with pytest.raises(InvalidInput) as info:
        broker.decide(request.id, Decision.model_validate(decision), decided_by="a")
    assert info.value.code == code
    assert snapshot(broker.redis) == before


@pytest.mark.parametrize(
    "body",
    [
        {"outcome": "modified"},
        {"outcome": "maybe"},
        {"outcome": "approved", "args": {"a": 1}},
        {"outcome": "approved", "target": "managers"},
        {},
    ],
)
def test_malformed_decisions_are_refused_before_redis(body):
    with pytest.raises(ValidationError):
        Decision.model_validate(body)


def test_unknown_request_id(broker: Broker):
    with pytest.raises(NotFound):
        broker.decide("req_nope", Decision(outcome="approved"), decided_by="a")
    with pytest.raises(NotFound):
        broker.get_request("req_nope")
    with pytest.raises(NotFound):
        broker.escalate("req_nope", decided_by="a")
    assert snapshot(broker.redis) == {}


def test_unknown_queue_and_callback_are_refused_at_create(broker: Broker):
    with pytest.raises(InvalidInput, match="queue 'nowhere' is not defined"):
        broker.create_request(NewRequest(tool_name="t", queue="nowhere"))
    with pytest.raises(InvalidInput, match="callback webhook 'ops'"):
        broker.create_request(NewRequest(tool_name="t", callback="ops"))
    assert snapshot(broker.redis) == {}


def test_escalation_moves_request_and_keeps_it_pending(broker: Broker):
    request = broker.create_request(NewRequest(tool_name="t"))
    moved = broker.decide(
        request.id, Decision(outcome="escalated", reason="too big"), decided_by="bob"
    )
    assert moved.status is Status.pending and moved.queue == "managers"
    assert moved.expires_at > request.expires_at
    [entry] = moved.history
    assert (entry.event, entry.by, entry.from_queue, entry.to_queue, entry.reason) == (
        "escalated",
        "bob",
        "default",
        "managers",
        "too big",
    )
    for queue in ("default", "managers"):
        last = broker.redis.xrange(broker.keys.of_request(request.id).stream(queue))[-1][1]
        assert last[b"type"] == b"approval.escalated" and last[b"to"] == b"managers"
    with pytest.raises(InvalidInput, match="no escalate_to"):
        broker.decide(request.id, Decision(outcome="escalated"), decided_by="bob")
    with pytest.raises(InvalidInput, match="already in queue"):
        broker.decide(
            request.id, Decision(outcome="escalated", target="managers"), decided_by="bob"
        )


def test_listing_filters_by_status_and_queue(broker: Broker):
    a = broker.create_request(NewRequest(tool_name="a"))
    b = broker.create_request(NewRequest(tool_name="b", queue="managers"))
    c = broker.create_request(NewRequest(tool_name="c"))
    broker.decide(c.id, Decision(outcome="approved"), decided_by="x")
    assert {r.id for r in broker.list_requests(status="pending")} == {a.id, b.id}
    assert [r.id for r in broker.list_requests(status="pending", queue="managers")] == [b.id]
    assert [r.id for r in broker.list_requests(status="approved")] == [c.id]
    assert [r.id for r in broker.list_requests()] == [c.id, b.id, a.id]


def test_counts_follow_every_state_change(broker: Broker):
    a, b, c = (broker.create_request(NewRequest(tool_name=n)) for n in "abc")
    assert broker.counts() == {"pending:default": 3}
    broker.decide(a.id, Decision(outcome="rejected", reason="no"), decided_by="x")
    broker.escalate(b.id, decided_by="x")
    assert broker.counts() == {"pending:default": 1, "pending:managers": 1, "rejected:default": 1}
    broker.sweep(now=time.time() + 10_000)  # c moves on to managers, b times out there
    assert broker.counts() == {
        "pending:default": 0,
        "pending:managers": 1,
        "rejected:default": 1,
        "timed_out:managers": 1,
    }


def test_decided_requests_are_forgotten_after_the_retention(broker: Broker):
    old = broker.create_request(NewRequest(tool_name="old"))
    waiting = broker.create_request(NewRequest(tool_name="waiting", timeout_s=10**7))
    broker.decide(old.id, Decision(outcome="approved"), decided_by="x")
    ttl = broker.redis.ttl(broker.keys.request(old.id))
    assert broker.retention - 5 <= ttl <= broker.retention
    assert broker.redis.ttl(broker.keys.request(waiting.id)) == -1  # pending: kept until decided
    broker.redis.delete(broker.keys.request(old.id))  # as Redis does when the TTL runs out
    broker.sweep(now=time.time() + broker.retention + 1)
    assert broker.redis.zscore(broker.keys.of_request(old.id).requests, old.id) is None
    assert [r.id for r in broker.list_requests()] == [waiting.id]


def test_an_ended_run_is_forgotten_after_the_retention(broker: Broker):
    from broker.domain.models import RunStatus

    broker.create_run("agent", "go", run_id="r9")
    [request] = broker.create_round("r9", 1, [NewRequest(tool_name="x")])
    broker.save_messages("r9", b"[]")
    broker.decide(request.id, Decision(outcome="approved"), decided_by="a")
    broker.update_run("r9", status=RunStatus.running)
    assert broker.redis.ttl(broker.keys.run("r9")) == -1
    broker.update_run("r9", status=RunStatus.finished, output="{}")
    for key in (
        broker.keys.run("r9"),
        broker.keys.run_messages("r9"),
        broker.keys.run_round("r9", 1),
    ):
        assert broker.retention - 5 <= broker.redis.ttl(key) <= broker.retention, key


def test_a_decision_bound_to_a_queue_is_refused_once_the_request_moved(broker: Broker):
    request = broker.create_request(NewRequest(tool_name="t"))
    broker.escalate(request.id, decided_by="sweeper")
    before = snapshot(broker.redis)
    with pytest.raises(Conflict) as info:
        broker.decide(request.id, Decision(outcome="approved"), decided_by="a", in_queue="default")
    assert info.value.code == "escalated" and "escalated to managers" in info.value.detail
    assert snapshot(broker.redis) == before
    done = broker.decide(
        request.id, Decision(outcome="approved"), decided_by="b", in_queue="managers"
    )
    assert done.status is Status.approved


def test_a_one_time_marker_is_spent_with_the_decision_and_only_then(broker: Broker):
    keys = broker.keys
    a = broker.create_request(NewRequest(tool_name="a"))
    # b shares a's partition (on a single Redis every request does): on a cluster a marker is
    # kept in its request's partition (another partition's is a known gap, docs/architecture.md)
    b = broker.create_request(NewRequest(tool_name="b"))
    while keys.partition_of_request(b.id) != keys.partition_of_request(a.id):
        b = broker.create_request(NewRequest(tool_name="b"))
    once = (keys.seen("webhook", "ops:msg_1"), 900)
    kept = keys.in_partition(once[0], keys.partition_of_request(a.id))
    with pytest.raises(InvalidInput):  # refused: the marker stays unspent
        broker.decide(a.id, Decision(outcome="answered", answer=1), decided_by="w", once=once)
    assert not broker.redis.exists(kept)
    broker.decide(a.id, Decision(outcome="approved"), decided_by="w", once=once)
    assert 890 <= broker.redis.ttl(kept) <= 900
    for rid in (a.id, b.id):  # the same marker again, on any request of its partition: a replay
        with pytest.raises(Conflict) as info:
            broker.decide(rid, Decision(outcome="rejected", reason="x"), decided_by="w", once=once)
        assert info.value.code == "replayed"
    assert broker.get_request(b.id).is_pending
    moved = broker.escalate(
        b.id, decided_by="w", once=(broker.keys.seen("webhook", "ops:msg_2"), 900)
    )
    assert moved.queue == "managers"
    with pytest.raises(Conflict, match="already received"):
        broker.escalate(
            b.id, "default", decided_by="w", once=(broker.keys.seen("webhook", "ops:msg_2"), 900)
        )


def test_text_round_trips_exactly(broker: Broker):
    args = {"note": 'remboursé 🙂 \\u0000 "quoted"', "nested": {"list": [1, 2.5, None, True]}}
    request = broker.create_request(NewRequest(tool_name="t", args=args, prompt="Ça va? 🙂"))
    stored = broker.get_request(request.id)
    assert stored.args == args and stored.prompt == "Ça va? 🙂"
    assert stored.args_hash == args_hash(args)
