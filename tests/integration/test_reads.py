"""Listing from indexes: each index follows the Lua steps that change state, pages follow a
(score, id) cursor without duplicates or skips while requests arrive, and old entries leave."""

from __future__ import annotations

import threading
import time

import pytest
from redis import Redis
from redis.cluster import RedisCluster

from broker.domain.config import Config
from broker.domain.errors import InvalidInput
from broker.domain.models import Decision, NewRequest, Outcome, Request, Status
from broker.facade import Broker


def news(n: int, queue: str = "default", **kw: object) -> list[NewRequest]:
    return [NewRequest(tool_name="refund", args={"n": i}, queue=queue, **kw) for i in range(n)]


def members(broker: Broker, key: str) -> set[str]:
    return {m.decode() for m in broker.redis.zrange(key, 0, -1)}


def all_pages(broker: Broker, limit: int, **filters: object) -> list[Request]:
    seen: list[Request] = []
    cursor = None
    while True:
        page = broker.requests.list_page(limit=limit, cursor=cursor, **filters)
        assert len(page.items) <= limit
        seen += page.items
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


def approve(broker: Broker, rid: str) -> Request:
    return broker.decide(rid, Decision(outcome=Outcome.approved), decided_by="carol")


def test_indexes_follow_create_decide_escalate_and_timeout(broker: Broker) -> None:
    keys = broker.keys
    a, b, c = broker.create_requests(news(3))
    assert members(broker, keys.pending_in("default")) == {a.id, b.id, c.id}
    approve(broker, a.id)
    assert members(broker, keys.pending_in("default")) == {b.id, c.id}
    assert members(broker, keys.done("approved")) == {a.id}
    assert members(broker, keys.done_in("approved", "default")) == {a.id}
    broker.escalate(b.id, "managers", decided_by="carol")
    assert members(broker, keys.pending_in("default")) == {c.id}
    assert members(broker, keys.pending_in("managers")) == {b.id}
    assert members(broker, keys.in_queue("managers")) == {b.id}
    assert members(broker, keys.in_queue("default")) == {a.id, c.id}
    broker.sweep(now=time.time() + 100_000)  # c escalates, then b and c time out
    broker.sweep(now=time.time() + 200_000)
    assert members(broker, keys.pending_in("managers")) == set()
    assert members(broker, keys.done_in("timed_out", "managers")) == {b.id, c.id}
    assert broker.requests.list_page(status="timed_out", queue="managers").items[0].id in {
        b.id,
        c.id,
    }


def test_each_filter_lists_exactly_its_requests(broker: Broker) -> None:
    mine = broker.requests.create_requests(news(3), created_by="svc")
    other = broker.create_requests(news(4, queue="managers"))
    run = broker.create_round("run_1", 0, news(2))
    approve(broker, mine[0].id)

    def ids(**f: object) -> set[str]:
        return {r.id for r in all_pages(broker, 2, **f)}

    assert ids(status="pending", queue="managers") == {r.id for r in other}
    assert ids(status="approved") == {mine[0].id}
    assert ids(status="approved", queue="managers") == set()
    assert ids(created_by="svc") == {r.id for r in mine}
    assert ids(created_by="svc", status="pending") == {mine[1].id, mine[2].id}
    assert ids(run_id="run_1") == {r.id for r in run}
    assert ids(queue="default") == {r.id for r in mine + run}
    assert len(ids()) == 9
    soonest_first = [r.expires_at for r in all_pages(broker, 3, status="pending")]
    assert soonest_first == sorted(soonest_first)
    assert broker.get_request(mine[1].id).created_by == "svc"


def test_paging_through_ties_in_score_gives_each_once_in_id_order(broker: Broker) -> None:
    batch = broker.create_requests(news(250))  # one step: every score is the same
    got = [r.id for r in all_pages(broker, 7, status="pending", queue="default")]
    assert got == sorted(r.id for r in batch)
    newest_first = [r.id for r in all_pages(broker, 9, queue="default")]
    assert newest_first == sorted(newest_first, reverse=True)


def test_a_cursor_whose_request_was_decided_still_goes_on_from_there(broker: Broker) -> None:
    batch = sorted(r.id for r in broker.create_requests(news(10)))
    first = broker.requests.list_page(status="pending", limit=4)
    assert [r.id for r in first.items] == batch[:4]
    approve(broker, batch[3])  # the cursor's own request leaves the pending index
    approve(broker, batch[4])
    rest = all_pages_from(broker, first.next_cursor, status="pending")
    assert [r.id for r in rest] == batch[5:]


def all_pages_from(broker: Broker, cursor: str | None, **f: object) -> list[Request]:
    out: list[Request] = []
    while cursor:
        page = broker.requests.list_page(limit=3, cursor=cursor, **f)
        out += page.items
        cursor = page.next_cursor
    return out


@pytest.mark.parametrize("filters", [{"status": "pending"}, {}, {"queue": "default"}])
def test_paging_while_others_insert_has_no_duplicate_and_no_skip(
    broker: Broker, filters: dict[str, str]
) -> None:
    before = {r.id for r in broker.create_requests(news(300))}
    stop = threading.Event()
    inserted: list[str] = []

    def insert() -> None:
        other = Broker(broker.redis.__class__(connection_pool=broker.redis.connection_pool),
                       broker.config, prefix="t:")  # fmt: skip
        for _ in range(60):  # bounded: a pager can't chase inserts forever
            if stop.is_set():
                return
            inserted.extend(r.id for r in other.create_requests(news(5)))

    threads = [threading.Thread(target=insert) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while len(inserted) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)  # let inserts start before paging (not synchronisation)
        seen = [r.id for r in all_pages(broker, 13, **filters)]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert len(inserted) >= 20
    assert len(seen) == len(set(seen)), "a request came twice"
    assert before <= set(seen), "a request that existed when paging began was skipped"


def test_decided_entries_older_than_retention_leave_the_indexes_on_writes(
    broker: Broker,
) -> None:
    keys = broker.keys
    old = time.time() - broker.retention - 10
    for key in (keys.done("approved"), keys.done_in("approved", "default")):
        broker.redis.zadd(key, {"req_gone": old})  # its hash expired long ago
    [r] = broker.create_requests(news(1))
    approve(broker, r.id)
    assert members(broker, keys.done("approved")) == {r.id}
    assert members(broker, keys.done_in("approved", "default")) == {r.id}


def test_a_bad_cursor_or_one_for_other_filters_is_refused(broker: Broker) -> None:
    broker.create_requests(news(3))
    page = broker.requests.list_page(status="pending", limit=1)
    with pytest.raises(InvalidInput, match="other filters"):
        broker.requests.list_page(status="approved", cursor=page.next_cursor)
    with pytest.raises(InvalidInput) as err:
        broker.requests.list_page(cursor="%%%")
    assert err.value.code == "bad_cursor"


def test_a_filtered_page_reads_a_bounded_number_of_entries(broker: Broker) -> None:
    [seen] = broker.create_requests(news(1))
    broker.create_requests(news(2100))  # newer, none kept by the filter
    first = broker.requests.list_page(limit=10, keep=lambda r: r.id == seen.id)
    assert first.items == [] and first.next_cursor  # short page, with a way on
    second = broker.requests.list_page(limit=10, cursor=first.next_cursor,
                                       keep=lambda r: r.id == seen.id)  # fmt: skip
    assert [r.id for r in second.items] == [seen.id] and second.next_cursor is None
    assert broker.list_requests(status=Status.pending, limit=5)[0].status is Status.pending


@pytest.fixture(params=["single", "cluster"])
def any_broker(request: pytest.FixtureRequest, config: Config) -> Broker:
    """A broker on a single Redis (one partition) or on the local cluster (16)."""
    name = "redis" if request.param == "single" else "cluster_client"
    client: Redis | RedisCluster = request.getfixturevalue(name)
    return Broker(client, config, prefix="t:")


def test_reindex_puts_requests_stored_before_the_indexes_into_them(any_broker: Broker) -> None:
    from broker.reindex import Reindex

    broker = any_broker
    mine = broker.requests.create_requests(news(6), created_by="svc")
    run = broker.create_round("run_9", 0, news(2, queue="managers"))
    approve(broker, mine[0].id)
    if broker.keys.partitions > 1:  # on the cluster: spread over partitions, some not the first
        parts = {broker.keys.partition_of_request(r.id) for r in [*mine, *run]}
        assert len(parts) > 1 and parts != {0}
    before = {
        name: [r.id for r in all_pages(broker, 2, **f)]
        for name, f in {
            "pending": {"status": "pending"},
            "approved": {"status": "approved", "queue": "default"},
            "queue": {"queue": "managers"},
            "creator": {"created_by": "svc"},
            "run": {"run_id": "run_9"},
        }.items()
    }
    assert before["run"] == [r.id for r in run]
    for key in broker.redis.scan_iter(match="*t:*ix:*"):
        broker.redis.delete(key)
    broker.redis.delete(broker.keys.run_requests("run_9"))
    assert broker.requests.list_page(status="approved", queue="default").items == []
    assert broker.requests.list_page(created_by="svc").items == []
    assert Reindex(broker).run() == 8
    assert Reindex(broker).run() == 8  # twice: no harm
    for name, f in {
        "pending": {"status": "pending"},
        "approved": {"status": "approved", "queue": "default"},
        "queue": {"queue": "managers"},
        "creator": {"created_by": "svc"},
        "run": {"run_id": "run_9"},
    }.items():
        assert [r.id for r in all_pages(broker, 2, **f)] == before[name], name


def test_newest_first_goes_on_past_a_cursor_whose_request_moved(broker: Broker) -> None:
    batch = sorted((r.id for r in broker.create_requests(news(10))), reverse=True)  # tied
    first = broker.requests.list_page(queue="default", limit=4)
    assert [r.id for r in first.items] == batch[:4]
    approve(broker, batch[3])  # its entry is rescored to now: the cursor's (score, id) is gone
    rest = all_pages_from(broker, first.next_cursor, queue="default")
    assert [r.id for r in rest] == batch[4:]
