"""The create step writes a request of a shape it already wrote by COPY of that hash, with its
id and own values set (issue 18): on a single Redis and on a Redis Cluster, what is stored is
what writing each hash whole stores, a rule-decided request is never the one copied, and a
Redis user refused COPY (an ACL without `+copy`) still gets every request, written whole, with
one refusal in Redis's ACL log for the whole process. Copies holding an integer past 64 bits
come back exact."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from broker.domain.config import parse_config
from broker.domain.models import NewRequest, Request
from broker.domain.rules.models import parse_body
from broker.facade import Broker
from tests.support.acl_user import readme_user
from tests.support.backends import on_backend  # noqa: F401 - redis on both backends

CONFIG = {"queues": {"default": {}, "other": {"timeout_s": 60}}}
PER_REQUEST = {b"id", b"tool_call_id", b"created_at", b"expires_at"}


@pytest.fixture
def make(make_broker_on: Callable[..., Broker]) -> Callable[[bool], Broker]:
    """A Broker that copies (True) or writes every hash whole (False), in its own key space."""

    def build(copy: bool) -> Broker:
        broker = make_broker_on(parse_config(dict(CONFIG)), prefix=f"c{int(copy)}:")
        broker.requests.creating._copy = copy
        return broker

    return build


def stored(broker: Broker, request_id: str) -> dict[bytes, bytes]:
    return broker.redis.hgetall(broker.keys.request(request_id))


def batch() -> list[NewRequest]:
    """Copies, distinct requests of one shape, another queue, own tool call ids, a creator."""
    pay = NewRequest(tool_name="pay", args={"n": 9, "to": "x"}, metadata={"m": [1, {"k": 2}]})
    other = NewRequest(tool_name="pay", args={"n": 3, "to": "y"}, prompt="p", queue="other")
    return [
        pay,
        pay,
        NewRequest(tool_name="pay", args={"n": 8, "to": "z"}, metadata={"m": []}),
        pay,
        other,
        other,
        NewRequest(tool_name="pay", args={"n": 9, "to": "x"}, tool_call_id="call-1"),
        NewRequest(tool_name="pay", args={"n": 9, "to": "x"}, tool_call_id="call-2"),
        NewRequest(tool_name="pay", args={"n": 1}, created_by="svc"),
        NewRequest(tool_name="pay", args={"n": 1}, created_by="svc"),
        pay,
    ]


def copies(broker: Broker, backend: str) -> int:
    """COPY commands Redis ran so far (on a cluster: summed over its primaries; a replica
    counts again what it is sent)."""
    if backend == "cluster":
        stats = broker.redis.info("commandstats", target_nodes="primaries")
        return sum(v.get("cmdstat_copy", {}).get("calls", 0) for v in stats.values())
    return broker.redis.info("commandstats").get("cmdstat_copy", {}).get("calls", 0)


def copies_expected(broker: Broker, made: list[Request]) -> int:
    """The requests of each step (one per partition) that come after the first of their
    shape (variant and hash fields): the ones COPY makes."""
    groups: dict[int, list[Request]] = {}
    for r in made:
        groups.setdefault(broker.keys.partition_of_request(r.id), []).append(r)
    out = 0
    for group in groups.values():
        shapes = {(r.queue, r.created_by, frozenset(stored(broker, r.id)) - {b"id"}) for r in group}
        out += len(group) - len(shapes)
    return out


def comparable(broker: Broker, request_id: str) -> dict[bytes, bytes]:
    """The stored hash without what differs between two writes of one request."""
    raw = stored(broker, request_id)
    assert raw[b"id"] == request_id.encode()
    return {k: v for k, v in raw.items() if k not in PER_REQUEST}


def test_copied_hashes_store_what_whole_ones_do(
    make: Callable[[bool], Broker], backend: str
) -> None:
    copying, whole = make(True), make(False)
    news = batch()
    copies_before = copies(copying, backend)
    made = copying.create_requests(news)
    expected = copies_expected(copying, made)
    assert expected == (len(news) - 4 if backend == "single" else expected)  # 4 shapes
    assert copies(copying, backend) - copies_before == expected
    plain = whole.create_requests(news)
    assert copies(copying, backend) - copies_before == expected
    many = copying.create_requests([news[0]] * 40)  # on a cluster too: copies in each partition
    assert copies(copying, backend) - copies_before == expected + copies_expected(copying, many)
    assert copies_expected(copying, many) >= 40 - copying.keys.partitions
    assert copying.requests.creating._copy and not whole.requests.creating._copy
    for a, b, new in zip(made, plain, news, strict=True):
        assert comparable(copying, a.id) == comparable(whole, b.id)
        assert stored(copying, a.id).keys() == stored(whole, b.id).keys()
        got = copying.get_request(a.id)
        assert got == a
        assert got.tool_call_id == (new.tool_call_id or a.id)
        assert got.created_by == new.created_by and got.queue == new.queue
        assert copying.redis.ttl(copying.keys.request(a.id)) == -1  # pending: kept
    assert [r.args for r in made] == [n.args for n in news]
    listed = [r.id for r in copying.list_requests(limit=100)]
    assert sorted(listed) == sorted(r.id for r in made + many)  # every one listed


def test_a_rule_decided_request_is_never_the_one_copied(
    make: Callable[[bool], Broker],
) -> None:
    broker = make(True)
    broker.requests.rules.create(
        parse_body({"effect": "allow", "tool": "pay", "args": {"n": {"le": 5}}}), created_by="p"
    )
    low = NewRequest(tool_name="pay", args={"n": 1, "to": "x"})
    high = NewRequest(tool_name="pay", args={"n": 9, "to": "x"})
    made = broker.create_requests([low, high, high, low, low, high])
    assert [r.status for r in made] == ["approved", "pending", "pending"] + [
        "approved",
        "approved",
        "pending",
    ]
    for r in made:
        raw = stored(broker, r.id)
        assert raw[b"status"].decode() == r.status
        assert (b"decision" in raw) == (r.status == "approved")
        assert (broker.redis.ttl(broker.keys.request(r.id)) > 0) == (r.status == "approved")
        assert broker.get_request(r.id) == r
    pending = broker.list_requests(status="pending", limit=100)
    assert sorted(r.id for r in pending) == sorted(r.id for r in made if r.status == "pending")


def test_copies_with_an_integer_past_64_bits_come_back_exact(
    make: Callable[[bool], Broker],
) -> None:
    broker = make(True)
    new = NewRequest(tool_name="t", args={"a": {"b": 2**70}}, metadata={"m": {"n": -(2**65)}})
    made = broker.create_requests([new] * 3)
    for r in made:
        assert r.args == {"a": {"b": 2**70}} and r.metadata == {"m": {"n": -(2**65)}}
        assert broker.get_request(r.id) == r
    assert made[1].args["a"] is not made[2].args["a"]  # each copy its own


@pytest.fixture
def no_copy_url(tmp_path: Path) -> Iterator[tuple[Redis, str]]:
    """An embedded Redis with the README's user but refused COPY; yields an admin client
    and that user's URL."""
    with readme_user(tmp_path / "redis", "-copy") as (_, admin, url):
        yield admin, url


def test_a_user_refused_copy_gets_every_request_written_whole(
    no_copy_url: tuple[Redis, str],
) -> None:
    admin, url = no_copy_url
    broker = Broker(Redis.from_url(url), parse_config(dict(CONFIG)))
    reference = Broker(admin, parse_config(dict(CONFIG)), prefix="ab:whole:")
    reference.requests.creating._copy = False
    news = batch()
    for _ in range(3):  # refused in the first step only: the next ones don't ask
        made = broker.create_requests(news)
        assert not broker.requests.creating._copy
        plain = reference.create_requests(news)
        for a, b in zip(made, plain, strict=True):
            assert comparable(broker, a.id) == comparable(reference, b.id)
            assert broker.get_request(a.id) == a
    refused = [entry for entry in admin.acl_log() if entry["object"] == "copy"]
    assert [entry["count"] for entry in refused] == [1]
