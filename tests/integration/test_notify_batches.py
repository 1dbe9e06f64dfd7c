"""The notifier's Redis batches through redis-py's public API: the committer's batch as one
Lua step (a registered script), history notes written as pydantic writes them, and the router
reading a batch of requests in one pipeline as `broker.get_requests` reads them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.domain.models import NewRequest
from broker.facade import Broker
from broker.store.keys import NOTIFIER_GROUP
from notifiers.commit import Committer
from notifiers.parking import ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from tests.support.outbox_entries import pending_entry  # noqa: F401
from tests.support.waiting import wait_for

# ---- the committer's step ---------------------------------------------------------------


@pytest.fixture
def committed(broker: Broker) -> Iterator[tuple[Broker, Committer, list[str]]]:
    acked: list[str] = []
    fatal: list[str] = []
    committer = Committer(
        broker,
        lambda entries: acked.extend(e.event.entry_id for e in entries),
        ParkedStore(broker, lease_s=30),
        fatal.append,
    )
    assert broker.commits.one_step  # a single Redis: the one-step path
    yield broker, committer, acked
    committer.close()
    assert fatal == []


def _pending_ids(broker: Broker) -> list[str]:
    stream = broker.keys.stream("default")
    return [
        p["message_id"].decode()
        for p in broker.redis.xpending_range(stream, NOTIFIER_GROUP, "-", "+", 100)
    ]


def test_one_step_writes_markers_notes_counters_and_acks_only_when_all_are_done(
    committed: tuple[Broker, Committer, list[str]],
) -> None:
    broker, committer, acked = committed
    request = broker.create_request(NewRequest(tool_name="refund", args={"n": 1}))
    entry = pending_entry(broker, request.id)
    history_before = len(broker.get_request(request.id).history)

    committer.put(
        DeliveryResult(entry, ResultKind.attempt_failed, "webhook:a", "webhook", "HTTP 500")
    )
    committer.put(DeliveryResult(entry, ResultKind.delivered, "webhook:a", "webhook", "-> 204 (a)"))
    wait_for(
        lambda: broker.redis.hexists(
            broker.keys.delivery(request.id), entry.event.done_field("webhook:a")
        )
    )
    assert acked == [] and _pending_ids(broker) == [entry.event.entry_id]

    committer.put(DeliveryResult(entry, ResultKind.delivered, "webhook:b", "webhook", "-> 204 (b)"))
    wait_for(lambda: acked == [entry.event.entry_id])
    assert _pending_ids(broker) == []
    done = broker.redis.hgetall(broker.keys.delivery(request.id))
    assert {k.decode() for k in done} == {
        entry.event.done_field(c) for c in ("webhook:a", "webhook:b")
    }
    notes = broker.get_request(request.id).history[history_before:]
    assert [(n.event, n.channel, n.detail) for n in notes] == [
        ("delivered", "webhook:a", "-> 204 (a)"),
        ("delivered", "webhook:b", "-> 204 (b)"),
    ]
    stats = {k.decode(): int(v) for k, v in broker.redis.hgetall(broker.keys.stats).items()}
    assert stats == {"failed:webhook": 1, "delivered:webhook": 2}


def test_one_step_leaves_a_gone_request_alone_and_survives_a_refused_write(
    committed: tuple[Broker, Committer, list[str]],
) -> None:
    broker, committer, acked = committed
    gone = pending_entry(broker, "gone-1")
    broken = pending_entry(broker, "broken-1")
    broker.redis.set(broker.keys.delivery("broken-1"), "not a hash")  # HSET will be refused
    for entry in (gone, broken):
        for channel in ("webhook:a", "webhook:b"):
            committer.put(DeliveryResult(entry, ResultKind.delivered, channel, "webhook", "ok"))
    wait_for(lambda: sorted(acked) == sorted([gone.event.entry_id, broken.event.entry_id]))
    assert _pending_ids(broker) == []  # the refusals did not stop the acknowledgements
    assert not broker.redis.exists(broker.keys.request("gone-1"))  # no history made for it
    assert broker.redis.hlen(broker.keys.delivery("gone-1")) == 2
    assert broker.redis.get(broker.keys.delivery("broken-1")) == b"not a hash"


def test_the_step_comes_back_after_redis_forgot_its_script(
    committed: tuple[Broker, Committer, list[str]],
) -> None:
    broker, committer, acked = committed
    broker.redis.script_flush()  # a restarted or failed-over Redis knows no scripts
    entry = pending_entry(broker, "flushed-1")
    for channel in ("webhook:a", "webhook:b"):
        committer.put(DeliveryResult(entry, ResultKind.delivered, channel, "webhook", "ok"))
    wait_for(lambda: acked == [entry.event.entry_id])
    assert broker.redis.hlen(broker.keys.delivery("flushed-1")) == 2


def test_history_notes_are_the_text_pydantic_would_write() -> None:
    from broker.domain.models import HistoryEntry, utcnow
    from notifiers.commit import _note, _stamp

    now = utcnow()
    for detail in ("HTTP 204 (msg_1)", 'é"\\ \n\t\x01\x7f\u2028 😀', None):
        for channel in ("webhook:x", None):
            expected = HistoryEntry(at=now, event="delivered", channel=channel, detail=detail)
            assert _note(_stamp(now), "delivered", channel, detail) == expected.model_dump_json(
                exclude_none=True
            )


def test_router_reads_requests_as_broker_get_requests_does(broker: Broker) -> None:
    from notifiers.router import Router

    made = [broker.create_request(NewRequest(tool_name="refund", args={"n": n})) for n in range(3)]
    router = Router(broker, {}, {}, None, None, None, None)  # type: ignore[arg-type]
    found, problems = router.fetch({r.id for r in made} | {"missing-1"})
    assert problems == {}
    got = {rid: stored.request for rid, stored in found.items()}
    assert got == {r.id: r for r in broker.get_requests([r.id for r in made])}
