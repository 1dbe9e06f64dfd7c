"""The create step, on a single Redis and on a Redis Cluster: a bulk create indexes every
creator, the creator is recorded one way only, the Request handed back is the one stored
(without being read back), fields left at their default are not stored yet read back, and a
bulk with one bad request writes nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.domain.config import parse_config
from broker.domain.errors import InvalidInput
from broker.domain.models import NewRequest, Status
from broker.facade import Broker
from tests.support.backends import on_backend  # noqa: F401 - redis on both backends

CONFIG = {
    "queues": {"default": {}, "finance": {"quorum": 2}},
    "approvers": {"ann": {"roles": ["finance"]}},
}


@pytest.fixture
def broker(make_broker_on: Callable[..., Broker]) -> Broker:
    return make_broker_on(parse_config(dict(CONFIG)))


def test_a_mixed_creator_bulk_create_indexes_every_creator(broker: Broker) -> None:
    news = [
        NewRequest(tool_name="refund", args={"i": i}, created_by=["ann", "bob", None][i % 3])
        for i in range(30)
    ]
    made = broker.create_requests(news)
    for name in ("ann", "bob"):
        page = broker.requests.list_page(created_by=name, limit=100)
        assert {r.id for r in page.items} == {r.id for r in made if r.created_by == name}
        assert len(page.items) == 10
    assert {r.created_by for r in made} == {"ann", "bob", None}
    for r in made:
        assert broker.get_request(r.id).created_by == r.created_by


def test_created_by_argument_is_the_same_as_the_field(broker: Broker) -> None:
    by_arg = broker.requests.create_request(NewRequest(tool_name="a"), created_by="cat")
    by_field = broker.requests.create_request(NewRequest(tool_name="a", created_by="cat"))
    for made in (by_arg, by_field):
        assert made.created_by == "cat"
        assert broker.get_request(made.id).created_by == "cat"
    page = broker.requests.list_page(created_by="cat", limit=10)
    assert {r.id for r in page.items} == {by_arg.id, by_field.id}


def test_the_request_handed_back_is_the_one_stored(broker: Broker) -> None:
    news = [
        NewRequest(
            tool_name="refund", args={"amount": 180.0, "order": "A-1", "n": [1, {"x": None}]}
        ),
        NewRequest(
            tool_name="pay",
            args={"to": "/srv/app/x.txt"},
            prompt="Pay?",
            data={"k": [1, 2.5, "é"]},
            metadata={"customer": "c-17"},
            queue="finance",
            allowed_roles=["finance"],
            tool_call_id="call-7",
            timeout_s=30,
            args_schema={"type": "object", "properties": {"to": {"type": "string"}}},
            created_by="ann",
        ),
        NewRequest(
            tool_name="ask",
            kind="question",
            metadata={"answer_schema": {"type": "object", "properties": {"a": {"type": "string"}}}},
        ),
    ]
    made = broker.create_requests(news)
    for got in made:
        assert got == broker.get_request(got.id)
        assert got.public() == broker.get_request(got.id).public()
    assert made[1].quorum == 2 and made[1].tool_call_id == "call-7"
    assert made[0].tool_call_id == made[0].id
    assert made[0].suggested_rules and made[2].suggested_rules == []
    run = broker.create_run("bot", "go").id
    for got in broker.create_round(run, 1, news[:2]):
        assert got == broker.get_request(got.id)
        assert got.suggested_rules[0] == {"effect": "allow", "tool": got.tool_name, "run_id": run}


def test_copies_of_one_new_request_give_independent_requests(broker: Broker) -> None:
    new = NewRequest(tool_name="refund", args={"order": "A-1", "items": [1]})
    made = broker.create_requests([new] * 50)
    assert len({r.id for r in made}) == 50
    made[0].args["items"].append(2)
    assert made[1].args == {"order": "A-1", "items": [1]} and new.args["items"] == [1]
    assert all(broker.get_request(r.id).status is Status.pending for r in made)


def test_fields_at_their_default_are_not_stored_but_read_back(broker: Broker) -> None:
    made = broker.create_request(NewRequest(tool_name="refund", args={"order": "A-1"}))
    stored = {k.decode() for k in broker.redis.hgetall(broker.keys.request(made.id))}
    for name in ("approvals", "history", "created_by", "quorum", "callback", "run_id", "data"):
        assert name not in stored
    assert {"id", "status", "queue", "args_hash", "created_at", "expires_at"} <= stored
    again = broker.get_request(made.id)
    assert (again.quorum, again.approvals, again.history, again.created_by) == (1, [], [], None)
    assert again.tool_call_id == made.id and again.run_id is None and again.data is None


def test_a_bulk_with_one_bad_request_writes_nothing(broker: Broker) -> None:
    news = [NewRequest(tool_name="refund", args={"i": i}) for i in range(20)]
    news.append(NewRequest(tool_name="refund", queue="nowhere"))
    with pytest.raises(InvalidInput) as caught:
        broker.create_requests(news)
    assert caught.value.code == "unknown_queue"
    assert sum(broker.requests.counts().values()) == 0
    assert broker.requests.list_page(limit=100).items == []


def test_a_bulk_lands_in_every_partition_and_counts_add_up(broker: Broker) -> None:
    made = broker.create_requests([NewRequest(tool_name="t", args={"i": i}) for i in range(400)])
    assert [r.args["i"] for r in made] == list(range(400))
    assert broker.requests.counts() == {"pending:default": 400}
    parts = {broker.keys.partition_of_request(r.id) for r in made}
    assert len(parts) == (1 if broker.keys.partitions == 1 else broker.keys.partitions)
