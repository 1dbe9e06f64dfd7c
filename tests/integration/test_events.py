"""`GET /v1/events` over a real server: idle streams stay up, events go only to who may see
them, `Last-Event-ID` resumes without loss or duplicates, and streams per principal are capped.

The stream tests run on a single Redis and on the local Redis Cluster (16 partitions, each its
own slot and streams): there events of different partitions may arrive in another order than
they happened, so those tests compare sets, and check that their requests span partitions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis
from redis.cluster import RedisCluster

from api.app import create_app
from api.events import EventsSettings, decode_position, encode_position
from api.testing import ServerThread
from broker.domain.config import Config, parse_config
from broker.domain.errors import ConfigError
from broker.domain.models import Decision, NewRequest, Request
from broker.domain.settings import Settings
from broker.facade import Broker
from tests.support.auth import bearer, person
from tests.support.cluster_reads import blocked_reads
from tests.support.sse import events_of, next_event  # noqa: F401
from tests.support.waiting import wait_for

ADMIN = "tok-admin-of-the-event-stream-tests"
APPROVERS = {
    "fin": ["finance"],  # may decide finance requests
    "ops": ["ops"],  # an approver without the role finance requests need
    "svc": ["requester"],  # an agent's token: asks, never decides
    "audit": ["auditor"],  # reads everything
}


def config() -> Config:
    return parse_config(
        {
            "queues": {"default": {"channels": ["inbox"]}, "other": {"channels": ["inbox"]}},
            "approvers": {name: person(f"tok-{name}", roles) for name, roles in APPROVERS.items()},
        }
    )


@pytest.fixture
def cfg() -> Config:
    return config()


@pytest.fixture(params=["single", "cluster"])
def store(request: pytest.FixtureRequest) -> Redis | RedisCluster:
    """The broker's Redis: a single one, or the local cluster (flushed first either way)."""
    name = "redis" if request.param == "single" else "cluster_client"
    client: Redis | RedisCluster = request.getfixturevalue(name)
    return client


def clustered(broker: Broker) -> bool:
    return broker.keys.partitions > 1


def spans_partitions(broker: Broker, ids: list[str]) -> bool:
    """On the cluster: some of `ids` are outside partition 0 (a reader of it alone would fail)."""
    return not clustered(broker) or any(broker.keys.partition_of_request(i) for i in ids)


def in_order(broker: Broker, items: list[Any]) -> list[Any]:
    """`items` as a single Redis orders them (as they happened); sorted on the cluster."""
    return sorted(items) if clustered(broker) else list(items)


@pytest.fixture
def api(store: Redis | RedisCluster, cfg: Config) -> Iterator[tuple[str, Broker]]:
    broker = Broker(store, cfg, prefix="t:")
    fast = EventsSettings(heartbeat_s=0.5, max_streams_per_principal=2)
    app = create_app(Settings(admin_token=ADMIN), cfg, broker, events_settings=fast)
    with ServerThread(app) as server:
        yield server.url, broker


def make(broker: Broker, **kw: Any) -> Request:
    kw.setdefault("tool_name", "refund")
    return broker.create_request(NewRequest(**kw))


def test_event_ids_round_trip_and_foreign_ids_are_refused() -> None:
    positions = {"default": "1733-0", "a&b=c": "17-4"}
    assert decode_position(encode_position(positions)) == positions
    for bad in ("1733-0", "default=now", "=", "default=1-0&x", "default=1-0.2-0"):
        with pytest.raises(Exception, match="Last-Event-ID"):
            decode_position(bad)
    vector = {"default": ".".join(["0", *(f"{i}-{i}" for i in range(15))])}
    assert decode_position(encode_position(vector), 16) == vector  # a cluster's 16 partitions
    assert decode_position("default=1733-0", 16) == {"default": "1733-0"}  # a single Redis's
    for bad in ("default=1-0.2-0", "default=now", "default=1-0..2"):
        with pytest.raises(Exception, match="Last-Event-ID"):
            decode_position(bad, 16)


def test_the_stream_cap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EventsSettings.from_env().max_streams_per_principal == 10
    monkeypatch.setenv("APPROVAL_BROKER_SSE_MAX_STREAMS", "12")
    assert EventsSettings.from_env().max_streams_per_principal == 12
    monkeypatch.setenv("APPROVAL_BROKER_SSE_MAX_STREAMS", "0")
    with pytest.raises(ConfigError, match="positive integer"):
        EventsSettings.from_env()


def test_events_reach_only_those_who_may_see_the_request(api: tuple[str, Broker]) -> None:
    url, broker = api
    names = ["fin", "ops", "svc", "audit", "admin"]
    tokens = {n: (ADMIN if n == "admin" else f"tok-{n}") for n in names}
    got: dict[str, list[str]] = {}
    with httpx.Client(base_url=url, timeout=10) as http:
        svc = http.post(
            "/v1/requests",
            json={"tool_name": "wire", "allowed_roles": ["finance"]},
            headers=bearer("tok-svc"),
        )
        assert svc.status_code == 201 and svc.json()["created_by"] == "svc"
        streams = {
            n: http.stream("GET", "/v1/events", headers=bearer(t)) for n, t in tokens.items()
        }
        readers = {}
        for name, cm in streams.items():
            resp = cm.__enter__()
            assert resp.status_code == 200
            readers[name] = events_of(resp.iter_lines())
            assert next(readers[name]).comment == "connected"
        try:
            finance = make(broker, allowed_roles=["finance"])
            anyone = make(broker)
            broker.decide(svc.json()["id"], _reject(), decided_by="fin")
            marker = make(broker, allowed_roles=["ops"])  # ends every reader's wait
            sid = svc.json()["id"]
            everything = [finance.id, anyone.id, sid, marker.id]
            expected = {
                "fin": [finance.id, anyone.id, sid],  # not the ops one
                "ops": [anyone.id, marker.id],  # not the finance ones
                "svc": [sid],  # its own, nothing it may not decide
                "audit": everything,
                "admin": everything,
            }
            for name, reader in readers.items():
                got[name] = []
                while len(got[name]) < len(expected[name]):
                    got[name].append(next_event(reader).data["id"])
        finally:
            for cm in streams.values():
                cm.__exit__(None, None, None)
    for name, ids in expected.items():
        assert in_order(broker, got[name]) == in_order(broker, ids), name
    assert spans_partitions(broker, everything)


def _reject() -> Decision:
    return Decision(outcome="rejected", reason="no")


def test_a_requester_gets_every_event_of_the_requests_it_creates(api: tuple[str, Broker]) -> None:
    """Its request is announced a moment before `created_by` is written: none may be lost."""
    url, broker = api
    got: list[tuple[str | None, str]] = []
    created: list[str] = []
    with httpx.Client(base_url=url, timeout=10) as http:
        with http.stream("GET", "/v1/events", headers=bearer("tok-svc")) as resp:
            reader = events_of(resp.iter_lines())
            assert next(reader).comment == "connected"
            make(broker)  # someone else's: never shown to svc
            for _ in range(30):
                body = {"tool_name": "wire", "allowed_roles": ["finance"]}
                made = http.post("/v1/requests", json=body, headers=bearer("tok-svc"))
                created.append(made.json()["id"])
                broker.decide(created[-1], _reject(), decided_by="fin")
                for _ in range(2):
                    item = next_event(reader)
                    got.append((item.event, item.data["id"]))
    expected = [(e, rid) for rid in created for e in ("approval.requested", "approval.decided")]
    assert got == expected


def test_a_reconnect_with_last_event_id_gets_what_it_missed_once(api: tuple[str, Broker]) -> None:
    url, broker = api
    with httpx.Client(base_url=url, timeout=10) as http:
        with http.stream("GET", "/v1/events", headers=bearer(ADMIN)) as resp:
            reader = events_of(resp.iter_lines())
            assert next(reader).comment == "connected"
            first = make(broker)
            seen = next_event(reader)
            assert seen.data["id"] == first.id and seen.id
        missed = [make(broker) for _ in range(4)] + [make(broker, queue="other")]
        broker.decide(missed[0].id, _reject(), decided_by="fin")
        headers = {**bearer(ADMIN), "Last-Event-ID": seen.id}
        with http.stream("GET", "/v1/events", headers=headers) as resp:
            assert resp.status_code == 200
            reader = events_of(resp.iter_lines())
            assert next(reader).comment == "connected"
            after = make(broker)
            got = []
            while len(got) < len(missed) + 2:
                item = next_event(reader)
                got.append((item.event, item.data["id"]))
        bad = http.get("/v1/events", headers={**bearer(ADMIN), "Last-Event-ID": "garbage"})
    expected = [("approval.requested", r.id) for r in missed]
    expected.insert(1, ("approval.decided", missed[0].id))
    if clustered(broker):  # what it missed and what came after, each once, in any order
        assert sorted(got) == sorted([*expected, ("approval.requested", after.id)])
    else:
        assert sorted(got[:-1]) == sorted(expected)
        assert got[-1:] == [("approval.requested", after.id)]  # and nothing twice
    assert spans_partitions(broker, [r.id for r in missed])
    assert bad.status_code == 400 and bad.json()["error"] == "bad_last_event_id"
    position = decode_position(seen.id, broker.keys.partitions)
    assert set(position) == {"default", "other"}  # one value per queue, on either
    parts = {len(v.split(".")) for v in position.values()}
    assert parts == {broker.keys.partitions}  # on the cluster: a position per partition


def test_idle_streams_get_heartbeats_and_a_cap_per_principal(api: tuple[str, Broker]) -> None:
    url, broker = api
    with httpx.Client(base_url=url, timeout=10) as http:
        with (
            http.stream("GET", "/v1/events", headers=bearer("tok-fin")) as one,
            http.stream("GET", "/v1/events", headers=bearer("tok-fin")) as two,
        ):
            assert one.status_code == two.status_code == 200
            reader = events_of(one.iter_lines())
            assert next(reader).comment == "connected"
            assert next(reader).comment == "heartbeat"
            # a blocking read each on a single Redis; on the cluster both share the process's
            # one reader, a blocking read per partition
            want = broker.keys.partitions if clustered(broker) else 2
            wait_for(lambda: blocked_reads(broker) == want)
            third = http.get("/v1/events", headers=bearer("tok-fin"))
            assert third.status_code == 429
            assert third.json()["error"] == "too_many_streams" and third.json()["detail"]
            with http.stream("GET", "/v1/events", headers=bearer("tok-ops")) as other:
                assert other.status_code == 200  # the cap is per principal
        # closed streams give their slots back (the server notices at the next write)
        deadline = time.monotonic() + 10
        while True:
            with http.stream("GET", "/v1/events", headers=bearer("tok-fin")) as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline, "slots were not released"
            time.sleep(0.1)


def test_an_idle_stream_outlives_the_redis_socket_timeout_with_a_heartbeat_and_no_error_logged(
    redis_url: str, tmp_path: Path
) -> None:
    """The real `approval-broker api` (default 15 s heartbeat, redis-py's 5 s socket timeout),
    idle until its first heartbeat: about three socket timeouts' worth."""
    conf = tmp_path / "approval-broker.toml"
    conf.write_text('[queues.default]\nchannels = ["inbox"]\n')
    log_path = tmp_path / "api.log"
    env = {
        **os.environ,
        "APPROVAL_BROKER_REDIS_URL": redis_url,
        "APPROVAL_BROKER_ADMIN_TOKEN": ADMIN,
        "APPROVAL_BROKER_CONFIG": str(conf),
        "APPROVAL_BROKER_DATA_DIR": str(tmp_path),
        "APPROVAL_BROKER_KEY_PREFIX": "idle:",
    }
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from approval_broker.cli import main; main()", "api"]
            + ["--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("API listening on "), line
        base = line.removeprefix("API listening on ")
        broker = Broker(Redis.from_url(redis_url), parse_config({}), prefix="idle:")
        heartbeats = 0
        with httpx.Client(base_url=base, timeout=20) as http:
            with http.stream("GET", "/v1/events", headers=bearer("tok-fin")) as gone:
                assert gone.status_code == 401
            with httpx.Client(base_url=base, timeout=20) as leaver:  # goes away mid-stream
                with leaver.stream("GET", "/v1/events", headers=bearer(ADMIN)) as left:
                    assert next(left.iter_lines()) == ": connected"
            with http.stream("GET", "/v1/events", headers=bearer(ADMIN)) as resp:
                reader = events_of(resp.iter_lines())
                assert next(reader).comment == "connected"
                started = time.monotonic()
                while not heartbeats:  # the first one comes after 15 s of silence
                    item = next(reader)
                    assert item.event is None, item  # nothing happened: only comments
                    heartbeats += item.comment == "heartbeat"
                assert time.monotonic() - started > 2 * 5  # socket timeouts went by
                created = make(broker)  # and after that long idle, events still arrive
                assert next_event(reader).data["id"] == created.id
                proc.terminate()  # with the stream open: it ends, the server exits promptly
                assert all(item.event is None for item in reader)
                proc.wait(10)  # (uvicorn re-raises SIGTERM once it has shut down)
                # the stream ended itself: uvicorn never had to cancel it at its graceful limit
                assert "timeout graceful shutdown exceeded" not in log_path.read_text()
    finally:
        proc.terminate()
        proc.wait(10)
    text = log_path.read_text()
    for word in ("Traceback", "ERROR", "Exception", "Error"):
        assert word not in text, text[-3000:]
