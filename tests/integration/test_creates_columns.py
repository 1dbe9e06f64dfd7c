"""The create step's column-wise batches (issue 18): fields every request of a call shares are
sent once, each request sends only its own, and every request is still stored exactly as it
would be alone. Mixed batches (queues, creators, timeouts, tool call ids, distinct args, rules
deciding some) on a single Redis and a cluster; ids made per batch stay unique and well formed;
the args' canonical JSON by orjson is byte for byte `canonical_json`'s."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from broker.domain.args_hash import args_hash, canonical_json
from broker.domain.config import parse_config
from broker.domain.ids import new_id, new_ids
from broker.domain.models import NewRequest, Request, Status
from broker.facade import Broker
from broker.redis.replies import as_str
from broker.store.request_hash import canonical_args
from broker.store.rule_sync import sync_at_start
from tests.support.backends import on_backend  # noqa: F401 - redis on both backends

CONFIG = {
    "queues": {"default": {}, "finance": {"quorum": 2, "timeout_s": 60}, "ops": {}},
    "approvers": {"ann": {"roles": ["finance"]}},
    "rules": [{"id": "lookups", "effect": "allow", "tool": "lookup"}],
}


@pytest.fixture
def broker(make_broker_on: Callable[..., Broker]) -> Broker:
    made = make_broker_on(parse_config(dict(CONFIG)))
    sync_at_start(made.requests.rules)
    return made


def stored(broker: Broker, request_id: str) -> dict[str, str]:
    raw = broker.redis.hgetall(broker.keys.request(request_id))
    return {as_str(k): as_str(v) for k, v in raw.items()}


def mixed() -> list[NewRequest]:
    """Requests that share some fields and differ in others, copies among them."""
    shared = NewRequest(tool_name="refund", args={"order": "A-1"}, metadata={"c": "c-1"})
    return [
        shared,
        NewRequest(tool_name="refund", args={"order": "A-2"}, metadata={"c": "c-1"}),
        NewRequest(tool_name="refund", args={"order": "A-3"}, queue="finance", created_by="ann"),
        shared,
        NewRequest(tool_name="pay", args={"to": "x"}, queue="ops", timeout_s=5, tool_call_id="c9"),
        NewRequest(tool_name="lookup", args={"q": "status"}),  # decided by rule `lookups`
        NewRequest(tool_name="refund", args={"order": "A-4"}, created_by="bob", prompt="Refund?"),
        NewRequest(tool_name="ask", kind="question", args={}, data={"k": [1, 2.5]}),
        shared,
    ]


def test_a_mixed_batch_stores_each_request_as_it_would_be_alone(broker: Broker) -> None:
    news = mixed()
    batch = broker.create_requests(news)
    alone = [broker.create_request(new) for new in news]
    volatile = {"id", "created_at", "expires_at", "args_hash"}
    for got, single in zip(batch, alone, strict=True):
        assert got == broker.get_request(got.id)
        mine, theirs = stored(broker, got.id), stored(broker, single.id)
        assert set(mine) == set(theirs)
        assert {k: v for k, v in mine.items() if k not in volatile | {"decision", "history"}} == {
            k: v for k, v in theirs.items() if k not in volatile | {"decision", "history"}
        }
        assert mine["args_hash"] == args_hash(got.args) == theirs["args_hash"]
    assert [r.status for r in batch] == [Status.pending] * 5 + [Status.approved] + [
        Status.pending
    ] * 3
    assert batch[2].quorum == 2 and batch[2].created_by == "ann"
    assert batch[4].tool_call_id == "c9" and batch[0].tool_call_id == batch[0].id
    assert batch[6].prompt == "Refund?" and batch[7].data == {"k": [1, 2.5]}


def test_a_mixed_batch_has_each_variants_expiry_and_index_entries(broker: Broker) -> None:
    batch = broker.create_requests(mixed())
    steps: dict[int, set] = {}  # one step per partition, one clock per step
    for r in batch:
        steps.setdefault(broker.keys.partition_of_request(r.id), set()).add(r.created_at)
    assert all(len(times) == 1 for times in steps.values())
    span = {r.id: (r.expires_at - r.created_at).total_seconds() for r in batch}
    assert math.isclose(span[batch[2].id], 60, abs_tol=1e-3)  # the finance queue's timeout
    assert math.isclose(span[batch[4].id], 5, abs_tol=1e-3)  # its own timeout_s
    assert span[batch[0].id] == span[batch[1].id] == span[batch[6].id]
    pending = [r for r in batch if r.status is Status.pending]
    assert broker.requests.counts() == {
        "pending:default": 6,
        "pending:finance": 1,
        "pending:ops": 1,
        "approved:default": 1,
    }
    listed = broker.requests.list_page(status="pending", limit=100).items
    assert {r.id for r in listed} == {r.id for r in pending}
    assert {r.id for r in broker.requests.list_page(queue="ops", limit=10).items} == {batch[4].id}
    for name, want in (("ann", {batch[2].id}), ("bob", {batch[6].id})):
        assert {r.id for r in broker.requests.list_page(created_by=name, limit=10).items} == want


def test_the_request_handed_back_has_every_field_in_the_models_order(broker: Broker) -> None:
    for got in broker.create_requests(mixed()):
        assert list(got.__dict__) == list(Request.model_fields)
        assert got.model_fields_set == set(Request.model_fields)


def test_a_taken_id_in_a_batch_writes_nothing_beside_it(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    [first] = broker.create_requests([NewRequest(tool_name="refund")])
    ids = iter([[f"req_fresh{i}" for i in range(5)] + [first.id]])
    monkeypatch.setattr("broker.store.requests.new_ids", lambda prefix, n: next(ids))
    with pytest.raises(Exception, match="already exists"):
        broker.create_requests([NewRequest(tool_name="refund", args={"i": i}) for i in range(6)])
    part = broker.keys.partition_of_request  # on a cluster, each partition all or none
    beside = [f"req_fresh{i}" for i in range(5) if part(f"req_fresh{i}") == part(first.id)]
    if broker.keys.partitions <= 1:
        assert broker.requests.counts() == {"pending:default": 1} and len(beside) == 5
    assert not any(broker.redis.exists(broker.keys.request(rid)) for rid in beside)


def test_ids_made_per_batch_are_unique_and_shaped_like_new_id() -> None:
    shape = re.compile(r"^req_[0-9a-f]{11}[0-9a-f]{16}$")
    ids = new_ids("req", 1000)
    assert len(set(ids)) == 1000 and all(shape.match(i) for i in ids)
    assert shape.match(new_id("req")) and new_ids("req", 0) == []
    assert abs(int(ids[0][4:15], 16) - int(new_id("req")[4:15], 16)) < 5_000


CORPUS = [
    {"order_id": "A-1042", "amount": 180.0, "currency": "EUR"},
    {"z": 1, "a": [1, 2, {"y": None, "b": True}], "m": {"é": "ü", "\U0001f600": "x"}},
    {"small": 1e-05, "tiny": 5e-324, "big": 1e16, "huge": 1.5e300, "neg": -0.0, "p": 0.0001},
    {"int": 2**63, "neg": -(2**63), "past64": 2**70, "f": 123456789012345.6},
    {"ctl": "".join(chr(c) for c in range(32)) + '"\\/\x7f\u2028'},
    {"nan": float("nan")},
    {"inf": float("inf"), "minf": float("-inf")},
    {"t": (1, 2), "nested": [[], {}, [[]]]},
    {"one-e+": "e+", "hex": "0.00001e-5"},
    {1: "int key"},
    {},
]


@pytest.mark.parametrize("args", CORPUS, ids=range(len(CORPUS)))
def test_canonical_args_is_canonical_json_byte_for_byte(args: dict) -> None:
    text, digest = canonical_args(args)
    assert text == canonical_json(args)
    assert digest == args_hash(args)


def test_canonical_args_on_random_values() -> None:
    rng = random.Random(18)

    def value(depth: int):
        kind = rng.randrange(7 if depth < 3 else 5)
        if kind == 0:
            return rng.random() * 10 ** rng.randint(-12, 20) * rng.choice((1, -1))
        if kind == 1:
            return rng.randint(-(2**65), 2**65)
        if kind == 2:
            return "".join(
                chr(rng.choice((rng.randrange(0x80), rng.randrange(0x3000)))) for _ in range(5)
            )
        if kind == 3:
            return rng.choice((None, True, False))
        if kind == 4:
            return rng.randint(-1000, 1000)
        if kind == 5:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{rng.randrange(100)}é": value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(3000):
        args = {f"a{i}": value(0) for i in range(rng.randrange(1, 5))}
        assert canonical_args(args) == (canonical_json(args), args_hash(args))


def test_canonical_args_refuses_what_canonical_json_refuses() -> None:
    class Opaque:
        pass

    for bad in ({"x": Opaque()}, {"x": {1, 2}}, {"when": datetime.now(UTC)}):
        with pytest.raises(TypeError):
            canonical_json(bad)
        with pytest.raises(TypeError):
            canonical_args(bad)
