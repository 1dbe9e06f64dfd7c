"""The create step after issue 18's second pass, on a single Redis and on a Redis Cluster: the
Requests of copies of one NewRequest are built from one template yet each has its own
structured values; a standalone approval's suggested rules are the ones a reader derives
(also when the caller's args are in another order than the stored ones); a request's id is
found in its key (a non-ASCII prefix or run id too) and a taken one is named; each stream is
trimmed to its maxlen, however large the step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import islice

import pytest

from broker.domain.config import parse_config
from broker.domain.errors import InvalidInput
from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.redis.replies import as_str
from tests.support.backends import on_backend  # noqa: F401 - redis on both backends

CONFIG = {"queues": {"default": {}}, "broker": {"stream_maxlen": 1000}}


@pytest.fixture
def broker(make_broker_on: Callable[..., Broker]) -> Broker:
    return make_broker_on(parse_config(dict(CONFIG)))


def test_a_standalone_approval_suggests_what_its_reader_derives(broker: Broker) -> None:
    new = NewRequest(tool_name="pay", args={"b": 1, "a": 2, "to": "/srv/app/x"})
    made = [broker.create_request(new), *broker.create_requests([new] * 3)]
    for got in made:
        again = broker.get_request(got.id)
        assert got.suggested_rules == again.suggested_rules
        assert got.model_dump_json() == again.model_dump_json()
    assert made[0].suggested_rules == [
        {"effect": "allow", "tool": "pay", "args": {"to": {"prefix": "/srv/app/"}}}
    ]
    mixed = NewRequest(tool_name="pay", args={"z": 5, "y": 7})  # the first number: `y`, stored
    [got] = broker.create_requests([mixed])
    assert got.suggested_rules == [{"effect": "allow", "tool": "pay", "args": {"y": {"le": 7}}}]


@pytest.mark.parametrize(
    "new",
    [
        NewRequest(tool_name="refund", args={"order": "A-1", "n": 2}),  # flat: copied
        NewRequest(
            tool_name="refund",
            args={"order": {"id": "A-1", "lines": [1, 2]}},  # nested: decoded again
            data={"k": [1, {"x": None}]},
            metadata={"customer": {"id": "c-17"}},
            allowed_roles=["finance"],
            args_schema={"type": "object"},
        ),
        NewRequest(tool_name="ask", kind="question"),  # no suggested rules, no metadata
    ],
)
def test_copies_built_from_one_template_share_no_mutable_value(
    broker: Broker, new: NewRequest
) -> None:
    made = broker.create_requests([new] * 4)
    first, others = made[0], made[1:]
    stored = broker.get_request(first.id)
    for name in ("args", "data", "metadata", "suggested_rules", "args_schema"):
        for got in made:
            assert getattr(got, name) == getattr(stored, name)
    for got in made:
        for other in made:
            if got is not other:
                for name in ("args", "metadata", "allowed_roles", "history", "approvals"):
                    assert getattr(got, name) is not getattr(other, name)
    first.args["added"] = 1
    first.metadata["added"] = 1
    first.suggested_rules.append({"effect": "deny"})
    first.allowed_roles.append("x")
    first.history.append(None)  # type: ignore[arg-type]
    if isinstance(first.data, list):
        first.data.append(3)
    for value in first.args.values():
        if isinstance(value, dict):
            value["added"] = 1
    for got in others:
        assert got == broker.get_request(got.id)
        assert "added" not in got.args and "added" not in got.metadata
        assert {"effect": "deny"} not in got.suggested_rules
        assert got.allowed_roles == list(new.allowed_roles) and got.history == []
    assert new.args.get("added") is None and "added" not in new.metadata


def test_a_taken_id_is_named_and_nothing_is_written(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    [first] = broker.create_requests([NewRequest(tool_name="refund")])
    part = broker.keys.partition_of_request
    candidates = (f"req_new{i}" for i in range(100_000))
    fresh = list(islice((r for r in candidates if part(r) == part(first.id)), 3))  # one step
    monkeypatch.setattr("broker.store.requests.new_ids", lambda prefix, n: [*fresh, first.id])
    with pytest.raises(InvalidInput) as caught:
        broker.create_requests([NewRequest(tool_name="refund", args={"i": i}) for i in range(4)])
    assert caught.value.code == "duplicate" and first.id in str(caught.value)
    assert not any(broker.redis.exists(broker.keys.request(rid)) for rid in fresh)


def test_ids_read_from_keys_with_a_non_ascii_prefix_and_run_id(
    make_broker_on: Callable[..., Broker],
) -> None:
    broker = make_broker_on(parse_config(dict(CONFIG)), prefix="tëst:")
    made = broker.create_requests([NewRequest(tool_name="t", args={"i": i}) for i in range(3)])
    run = broker.create_run("bot", "go", run_id="rün-é").id
    made += broker.create_round(run, 1, [NewRequest(tool_name="t"), NewRequest(tool_name="u")])
    assert [r.id for r in made[3:]] == ["rün-é.1.0", "rün-é.1.1"]
    for got in made:
        assert broker.get_request(got.id) == got
        raw = broker.redis.hgetall(broker.keys.request(got.id))
        assert as_str(raw[b"id"]) == got.id
    events = [
        as_str(fields[b"request_id"])
        for keys in broker.keys.parts()
        for _, fields in broker.redis.xrange(keys.stream("default"))
    ]
    assert sorted(events) == sorted(r.id for r in made)


def test_each_stream_stays_within_its_maxlen_after_steps_larger_than_one_trims_cap(
    make_broker_on: Callable[..., Broker],
) -> None:
    # one trim evicts at most 100 nodes (10,000 entries) by default: a step of 12,000 that
    # trimmed only once would leave its stream of maxlen 1,000 about 1,000 over. Steps that
    # large are taken only without the audit trail (with it, a bulk is cut into small steps)
    broker = make_broker_on(parse_config({**CONFIG, "audit": {"enabled": False}}))
    for _ in range(2):
        broker.create_requests([NewRequest(tool_name="t", args={"i": i}) for i in range(12_000)])
    lengths = [broker.redis.xlen(keys.stream("default")) for keys in broker.keys.parts()]
    assert all(length <= 1000 + 100 for length in lengths), lengths  # `~`: whole nodes of 100
    assert sum(lengths) >= 1000  # trimmed, not emptied
    assert broker.requests.counts() == {"pending:default": 24_000}


def test_with_the_audit_trail_a_bulk_is_one_step_per_partition_each_audited(
    broker: Broker,
) -> None:
    """The trail's hashes are computed outside Redis (`broker.audit.sealing`), so a bulk need
    not be cut into small steps to keep Redis free: it stays all or none per partition, its
    entries numbered one after the other in each chain (a step reads each chain's head once)."""
    from broker.audit import AuditTrail, verify

    steps: list[int] = []
    create = broker.requests.creating.create

    def counted(run_id, round_no, ids, news, prepared=None):  # type: ignore[no-untyped-def]
        steps.append(len(ids))
        return create(run_id, round_no, ids, news, prepared)

    broker.requests.creating.create = counted  # type: ignore[method-assign]
    made = broker.create_requests([NewRequest(tool_name="t", args={"i": i}) for i in range(600)])
    assert len(made) == 600 and len({r.id for r in made}) == 600
    partitions = {broker.keys.partition_of_request(r.id) for r in made}
    assert len(steps) == len(partitions) and sum(steps) == 600
    trail = AuditTrail(broker.redis, broker.keys)
    entries = list(trail.entries())
    assert {e.request_id for e in entries if e.event == "created"} == {r.id for r in made}
    assert verify(list(enumerate(entries, 1)))[0] is None
    per_chain = Counter(e.chain for e in entries)
    assert {chain: seq for chain, (seq, _) in trail.heads().items()} == per_chain
