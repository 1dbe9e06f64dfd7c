"""Long-polls over real HTTP: `GET /v1/requests/{id}?wait=S` and `POST /v1/requests/wait` wake on
the request's own outcome event (a decision or the sweeper's time-out), not on a timer.

Each runs on a single Redis and on the local Redis Cluster, where the requests a test waits on
are made outside partition 0 (the reader must follow every partition's streams)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis import Redis
from redis.cluster import RedisCluster

from api.app import create_app
from api.testing import ServerThread
from broker.domain.config import Config
from broker.domain.errors import NotFound
from broker.domain.models import Decision, NewRequest, Request
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.remote import RemoteBroker
from tests.support.cluster_reads import blocked_reads
from tests.support.waiting import wait_for

ADMIN = "tok-admin"


API_CONFIG = {
    "queues": {
        "default": {"timeout_s": 600, "escalate_to": "managers"},
        "managers": {"timeout_s": 1800},
    }
}


@pytest.fixture(params=["single", "cluster"])
def api_broker(request: pytest.FixtureRequest, cfg: Config) -> Broker:
    """A broker on a single Redis or on the local cluster (16 partitions)."""
    name = "redis" if request.param == "single" else "cluster_client"
    client: Redis | RedisCluster = request.getfixturevalue(name)
    return Broker(client, cfg, prefix="t:")


@pytest.fixture
def app(cfg: Config, api_broker: Broker) -> FastAPI:
    return create_app(Settings(admin_token=ADMIN), cfg, api_broker)


@pytest.fixture
def server(app: FastAPI) -> Iterator[ServerThread]:
    with ServerThread(app) as s:
        yield s


@pytest.fixture
def remote(server: ServerThread) -> Iterator[RemoteBroker]:
    with RemoteBroker(server.url, ADMIN) as client:
        yield client


def make(broker: Broker, **kw: Any) -> Request:
    """A new request; on the cluster one outside partition 0 (others made on the way stay)."""
    new = NewRequest(tool_name=kw.pop("tool_name", "refund"), **kw)
    while True:
        made = broker.create_request(new)
        if broker.keys.partitions == 1 or broker.keys.partition_of_request(made.id) != 0:
            return made


def watchers(app: FastAPI) -> int:
    waiter = getattr(app.state, "waiter", None)
    return len(waiter._watchers) if waiter is not None else 0


def parked(app: FastAPI, broker: Broker, n: int = 1) -> bool:
    """`n` ids are waited on and the reader blocks on every partition (so the long-poll has
    read its requests as pending: a decision now must wake it through the streams)."""
    return watchers(app) == n and blocked_reads(broker) == broker.keys.partitions


def _clients(broker: Broker) -> list[tuple[str, dict[str, Any]]]:
    """(node, CLIENT LIST entry) of every client of the broker's Redis (every master's)."""
    if isinstance(broker.redis, RedisCluster):
        lists = broker.redis.client_list(target_nodes=RedisCluster.PRIMARIES)
        return [(node, c) for node, clients in lists.items() for c in clients]
    return [("", c) for c in broker.redis.client_list()]


def client_ids(broker: Broker) -> set[tuple[str, str]]:
    return {(node, c["id"]) for node, c in _clients(broker)}


def reader_ids(broker: Broker) -> set[tuple[str, str]]:
    """The connections blocked in an XREAD now (the API's reader: nothing else reads here)."""
    return {(node, c["id"]) for node, c in _clients(broker) if c["cmd"] == "xread" and "b" in c["flags"]}  # fmt: skip


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def approve(broker: Broker, rid: str) -> None:
    broker.decide(rid, Decision(outcome="approved"), decided_by="alice")


def test_wait_answers_as_soon_as_the_request_is_decided(
    app: FastAPI, api_broker: Broker, remote: RemoteBroker
) -> None:
    req = make(api_broker)
    started = time.monotonic()
    thread, out = in_thread(lambda: remote.get_request(req.id, wait=30))
    wait_for(lambda: parked(app, api_broker))  # the long-poll is parked on its id
    approve(api_broker, req.id)
    thread.join(10)
    assert out and out[0].status == "approved"
    assert time.monotonic() - started < 5  # woken by the decision, not by the 30 s timeout
    # nobody listens any more: the reader stops once its blocked read returns (BLOCK_MS)
    wait_for(lambda: watchers(app) == 0 and app.state.waiter._task.done())


def test_wait_times_out_with_the_request_still_pending(
    api_broker: Broker, remote: RemoteBroker
) -> None:
    req = make(api_broker)
    started = time.monotonic()
    got = remote.get_request(req.id, wait=0.4)
    assert got.status == "pending"
    assert time.monotonic() - started >= 0.4


def test_wait_on_a_decided_request_answers_at_once(
    api_broker: Broker, remote: RemoteBroker
) -> None:
    req = make(api_broker)
    approve(api_broker, req.id)
    started = time.monotonic()
    assert remote.get_request(req.id, wait=30).status == "approved"
    assert time.monotonic() - started < 5


def test_a_time_out_by_the_sweeper_wakes_the_wait_too(
    app: FastAPI, api_broker: Broker, remote: RemoteBroker
) -> None:
    req = make(api_broker, queue="managers")
    thread, out = in_thread(lambda: remote.get_request(req.id, wait=30))
    wait_for(lambda: parked(app, api_broker))
    api_broker.sweep(now=time.time() + 3600)
    thread.join(10)
    assert out and out[0].status == "timed_out"


def test_an_escalation_does_not_end_the_wait(
    app: FastAPI, api_broker: Broker, remote: RemoteBroker
) -> None:
    req = make(api_broker)
    thread, out = in_thread(lambda: remote.get_request(req.id, wait=30))
    wait_for(lambda: parked(app, api_broker))
    api_broker.escalate(req.id, "managers", decided_by="alice")
    time.sleep(0.3)  # not synchronisation: the wait must still be running after an escalation
    assert thread.is_alive() and not out
    approve(api_broker, req.id)  # decided in the queue it moved to
    thread.join(10)
    assert out and out[0].status == "approved" and out[0].queue == "managers"


def test_wait_for_several_all_or_the_first(
    app: FastAPI, api_broker: Broker, remote: RemoteBroker
) -> None:
    a, b = make(api_broker), make(api_broker)
    thread, out = in_thread(lambda: remote.wait([a.id, b.id], 30, all=False))
    wait_for(lambda: parked(app, api_broker, 2))
    approve(api_broker, b.id)
    thread.join(10)
    assert [r.status for r in out[0]] == ["pending", "approved"]  # the order asked

    thread, out = in_thread(lambda: remote.wait([a.id, b.id], 30, all=True))
    wait_for(lambda: parked(app, api_broker, 2))
    api_broker.decide(a.id, Decision(outcome="rejected", reason="no"), decided_by="alice")
    thread.join(10)
    assert [r.status for r in out[0]] == ["rejected", "approved"]


def test_wait_bad_input_is_a_clear_4xx(
    api_broker: Broker, remote: RemoteBroker, server: ServerThread
) -> None:
    req = make(api_broker)
    with pytest.raises(NotFound):
        remote.wait([req.id, "req_nope"], 1)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=server.url, headers=auth) as http:
        for params in ({"wait": 61}, {"wait": 0}, {"wait": "soon"}):
            resp = http.get(f"/v1/requests/{req.id}", params=params)
            assert resp.status_code == 422 and set(resp.json()) == {"error", "detail"}, params
        for body in (
            {"ids": [], "timeout_s": 1},
            {"ids": [req.id], "timeout_s": 0},
            {"ids": [req.id], "timeout_s": 61},
            {"ids": ["a:b"], "timeout_s": 1},
            {"ids": [req.id]},
        ):
            resp = http.post("/v1/requests/wait", json=body)
            assert resp.status_code == 422 and set(resp.json()) == {"error", "detail"}, body
        started = time.monotonic()
        assert http.get("/v1/requests/req_nope?wait=30").status_code == 404
        assert time.monotonic() - started < 5  # nothing to wait for
        assert (
            httpx.post(
                f"{server.url}/v1/requests/wait", json={"ids": [req.id], "timeout_s": 1}
            ).status_code
            == 401
        )


def test_long_polls_one_after_another_open_no_new_redis_connection(
    app: FastAPI, api_broker: Broker, remote: RemoteBroker
) -> None:
    """A client that waits again right after a wait (a run waited on until it pauses, then
    until it ends) is served by the reader on connections that existed before: the reader's
    blocked reads are let finish when a long-poll ends, not cancelled (which drops them)."""
    req = make(api_broker)
    # the reader's connections: one blocked read per partition (on a busy machine a 0.2 s wait
    # could end before the reader had reached every partition, which later waits then opened)
    thread, out = in_thread(lambda: remote.get_request(req.id, wait=1))
    wait_for(lambda: len(reader_ids(api_broker)) == api_broker.keys.partitions)
    thread.join(10)
    assert out and out[0].status == "pending"
    existing = client_ids(api_broker)
    for _ in range(5):
        assert remote.get_request(req.id, wait=0.2).status == "pending"
    thread, out = in_thread(lambda: remote.get_request(req.id, wait=30))
    wait_for(lambda: parked(app, api_broker))
    assert reader_ids(api_broker) <= existing
    approve(api_broker, req.id)
    thread.join(10)
    assert out and out[0].status == "approved"
    # once nobody waits, the reader stops when its reads in flight return
    wait_for(lambda: watchers(app) == 0 and app.state.waiter._task.done(), timeout=5)


def test_many_waiters_share_one_reader(
    app: FastAPI, api_broker: Broker, remote: RemoteBroker, server: ServerThread
) -> None:
    reqs = [make(api_broker) for _ in range(10)]
    clients = [RemoteBroker(server.url, ADMIN) for _ in reqs]
    threads = [
        in_thread(lambda c=c, r=r: c.get_request(r.id, wait=30))
        for c, r in zip(clients, reqs, strict=True)
    ]
    wait_for(lambda: watchers(app) == len(reqs))
    # one blocked XREAD for all ten long-polls (per partition on the cluster), no polling loop
    wait_for(lambda: blocked_reads(api_broker) == api_broker.keys.partitions)
    assert len({api_broker.keys.partition_of_request(r.id) for r in reqs}) > 1 or (
        api_broker.keys.partitions == 1
    )
    for r in reqs:
        approve(api_broker, r.id)
    for thread, out in threads:
        thread.join(10)
        assert out and out[0].status == "approved"
    for c in clients:
        c.close()
