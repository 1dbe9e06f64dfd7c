"""Issue 18, notifier side: Redis batches without redis-py's pipeline layers (notifiers.lean),
the committer's batch as one Lua step, and the raw HTTP/1.1 poster reading replies by hand."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.retry import Retry

from broker.client import Broker
from broker.keys import NOTIFIER_GROUP
from broker.models import NewRequest
from notifiers.commit import Committer
from notifiers.events import REQUESTED, parse_entry
from notifiers.http_post import Poster
from notifiers.lean import LeanRedis, LeanScript, as_mapping
from notifiers.parking import ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from notifiers.tasks import InflightEntry
from tests.conftest import wait_for

# ---- notifiers.lean ---------------------------------------------------------------------


def test_lean_batch_replies_in_order_with_an_error_in_its_place(redis: Redis) -> None:
    lean = LeanRedis.for_client(redis)
    assert lean is not None
    redis.set("lean:s", "x")
    redis.hset("lean:h", mapping={"a": "1", "b": "2"})
    replies = lean.execute([("HGETALL", "lean:h"), ("HGETALL", "lean:s"), ("GET", "lean:s")])
    assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
    assert replies[2] == b"x"
    assert as_mapping(replies[0]) == {b"a": b"1", b"b": b"2"}
    assert lean.execute([("GET", "lean:s")]) == [b"x"]  # the connection stayed in step


def test_lean_script_is_loaded_again_after_redis_forgot_it(redis: Redis) -> None:
    lean = LeanRedis.for_client(redis)
    assert lean is not None
    script = LeanScript(lean, "return redis.call('INCR', KEYS[1]) + tonumber(ARGV[1])")
    assert script(["lean:n"], [10]) == 11
    redis.script_flush()
    assert script(["lean:n"], [10]) == 12


def _kill(redis: Redis, lean: LeanRedis) -> None:
    """Drop the lean connection from Redis's side, as a Redis restart would."""
    (client_id,) = lean.execute([("CLIENT", "ID")])
    redis.client_kill_filter(_id=client_id)


def test_a_lean_read_rides_out_a_dropped_connection_with_the_clients_retry(redis: Redis) -> None:
    given = redis.connection_pool.connection_kwargs
    patient = Redis(
        **{k: given[k] for k in ("host", "port", "db", "username", "password") if given.get(k)},
        retry=Retry(NoBackoff(), 3),
        retry_on_error=[RedisConnectionError],
    )
    lean = LeanRedis.for_client(patient)
    assert lean is not None
    redis.set("lean:r", "1")
    _kill(redis, lean)
    assert lean.execute([("GET", "lean:r")], retry=True) == [b"1"]  # reads: sent again
    _kill(redis, lean)
    with pytest.raises(RedisConnectionError):  # writes (the committer's step): never
        lean.execute([("GET", "lean:r")])
    patient.close()


def test_close_does_not_wait_for_a_batch_in_flight_and_refuses_later_ones(redis: Redis) -> None:
    lean = LeanRedis.for_client(redis)
    assert lean is not None
    failed: list[BaseException] = []

    def blocked() -> None:
        try:
            lean.execute([("BLPOP", "lean:never", 30)])  # a Redis that stopped answering
        except Exception as exc:  # noqa: BLE001 - what it ended with
            failed.append(exc)

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    wait_for(lambda: any(c.get("cmd") == "blpop" for c in redis.client_list()))
    lean.close()  # must not take the lock the blocked batch holds
    thread.join(5)
    assert not thread.is_alive() and len(failed) == 1
    with pytest.raises(RedisConnectionError):
        lean.execute([("GET", "lean:r")])


def test_no_lean_path_for_a_client_that_is_not_a_plain_redis() -> None:
    assert LeanRedis.for_client(object()) is None


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
    assert committer._step is not None  # a single Redis: the one-step path
    yield broker, committer, acked
    committer.close()
    assert fatal == []


def _pending_entry(broker: Broker, request_id: str) -> InflightEntry:
    stream = broker.keys.stream("default")
    broker.ensure_group(stream, NOTIFIER_GROUP)
    fields = {"type": REQUESTED, "request_id": request_id}
    broker.redis.xadd(stream, fields)
    ((_, entries),) = broker.redis.xreadgroup(NOTIFIER_GROUP, "t", {stream: ">"}, count=1)
    entry_id = entries[0][0].decode()
    event = parse_entry(stream, "default", entry_id, fields)
    return InflightEntry(event, None, remaining={"webhook:a", "webhook:b"})


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
    entry = _pending_entry(broker, request.id)
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
    gone = _pending_entry(broker, "gone-1")
    broken = _pending_entry(broker, "broken-1")
    broker.redis.set(broker.keys.delivery("broken-1"), "not a hash")  # HSET will be refused
    for entry in (gone, broken):
        for channel in ("webhook:a", "webhook:b"):
            committer.put(DeliveryResult(entry, ResultKind.delivered, channel, "webhook", "ok"))
    wait_for(lambda: sorted(acked) == sorted([gone.event.entry_id, broken.event.entry_id]))
    assert _pending_ids(broker) == []  # the refusals did not stop the acknowledgements
    assert not broker.redis.exists(broker.keys.request("gone-1"))  # no history made for it
    assert broker.redis.hlen(broker.keys.delivery("gone-1")) == 2
    assert broker.redis.get(broker.keys.delivery("broken-1")) == b"not a hash"


# ---- the raw poster ---------------------------------------------------------------------


class Scripted:
    """A loopback server that answers each request on a connection with the next reply given
    (raw bytes, or a callable taking the socket) and records what arrived."""

    def __init__(self, replies: list[bytes | Callable[[socket.socket], None]]) -> None:
        self.replies = list(replies)
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook?x=1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        except OSError:  # the client hung up on an answer it would not read
            pass

    def _answer(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while self.replies:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                while len(buf) < length:
                    buf += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + buf[:length])
                buf = buf[length:]
                reply = self.replies.pop(0)
                if callable(reply):
                    reply(conn)
                    return
                conn.sendall(reply)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    servers: list[Scripted] = []

    def make(replies: list[Any]) -> Scripted:
        servers.append(Scripted(replies))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_poster_sends_one_well_formed_request_and_reads_headers_by_hand(scripted: Any) -> None:
    server = scripted(
        [b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nX-Two: a:b\r\nContent-Length: 2\r\n\r\nno"]
    )
    poster = Poster(server.url, timeout_s=5)
    reply = poster.post(b'{"a": 1}', {"content-type": "application/json", "webhook-id": "msg_1"})
    poster.close()
    assert reply.status == 429
    assert reply.headers["retry-after"] == "7" and reply.headers["x-two"] == "a:b"
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /hook?x=1 HTTP/1.1"
    assert {b"content-type: application/json", b"webhook-id: msg_1", b"Content-Length: 8"} <= set(
        lines
    )
    assert any(line.startswith(b"Host: 127.0.0.1:") for line in lines)
    assert body == b'{"a": 1}'


def test_poster_keeps_the_connection_over_chunked_and_sized_bodies_and_skips_1xx(
    scripted: Any,
) -> None:
    server = scripted(
        [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nTrailer: t\r\n\r\n",
            b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 204 No Content\r\n\r\n",
        ]
    )
    poster = Poster(server.url, timeout_s=5)
    statuses = [poster.post(b"x%d" % i, {}).status for i in range(3)]
    poster.close()
    assert statuses == [200, 201, 204]
    assert server.connections == 1


@pytest.mark.parametrize(
    "first",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n" + b"z" * 70000,
    ],
    ids=["connection-close", "http-1.0", "body-too-long"],
)
def test_poster_does_not_reuse_a_connection_it_may_not(scripted: Any, first: bytes) -> None:
    server = scripted([first, b"HTTP/1.1 204 No Content\r\n\r\n"])
    poster = Poster(server.url, timeout_s=5)
    assert poster.post(b"one", {}).status == 200
    assert poster.post(b"two", {}).status == 204
    poster.close()
    assert server.connections == 2


def test_a_reply_cut_half_way_is_an_error_and_is_not_sent_again(scripted: Any) -> None:
    def cut(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")

    server = scripted([b"HTTP/1.1 204 No Content\r\n\r\n", cut])
    poster = Poster(server.url, timeout_s=5)
    assert poster.post(b"first", {}).status == 204
    with pytest.raises(http.client.IncompleteRead):
        poster.post(b"second", {})
    poster.close()
    assert [r.rpartition(b"\r\n\r\n")[2] for r in server.requests] == [b"first", b"second"]
    assert server.connections == 1  # a second send would have needed a new connection


def test_a_reset_after_part_of_the_reply_is_an_error_and_is_not_sent_again(scripted: Any) -> None:
    def reset(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST

    server = scripted([b"HTTP/1.1 204 No Content\r\n\r\n", reset])
    poster = Poster(server.url, timeout_s=5)
    assert poster.post(b"first", {}).status == 204
    with pytest.raises(http.client.IncompleteRead):
        poster.post(b"second", {})
    poster.close()
    assert server.connections == 1 and len(server.requests) == 2


@pytest.mark.parametrize(
    "reply",
    [
        "HTTP/1.1 \u00b200 OK\r\nContent-Length: 0\r\n\r\n".encode("latin-1"),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
    ],
    ids=["non-ascii-digit-status", "negative-chunk", "signed-chunk"],
)
def test_a_hostile_reply_is_an_http_error_not_a_crash(scripted: Any, reply: bytes) -> None:
    server = scripted([reply])
    poster = Poster(server.url, timeout_s=5)
    with pytest.raises(http.client.HTTPException):
        poster.post(b"x", {})
    poster.close()


def test_a_garbled_status_line_is_an_http_error(scripted: Any) -> None:
    server = scripted([b"SMTP ready\r\n\r\n"])
    poster = Poster(server.url, timeout_s=5)
    with pytest.raises(http.client.HTTPException):
        poster.post(b"x", {})
    poster.close()
    assert len(server.requests) == 1


def test_history_notes_are_the_text_pydantic_would_write() -> None:
    from broker.models import HistoryEntry, utcnow
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
    assert router.lean is not None
    found, problems = router.fetch({r.id for r in made} | {"missing-1"})
    assert problems == {}
    got = {rid: stored.request for rid, stored in found.items()}
    assert got == {r.id: r for r in broker.get_requests([r.id for r in made])}


def test_poster_puts_the_same_bytes_on_the_wire_as_http_client_did(scripted: Any) -> None:
    """Contract bytes: the request head and body are those of the `http.client` poster before."""
    ok = b"HTTP/1.1 204 No Content\r\n\r\n"
    server = scripted([ok, ok])
    headers = {"content-type": "application/json", "webhook-id": "msg_1", "user-agent": "ab/1"}
    body = b'{"type": "approval.requested"}'
    poster = Poster(server.url, timeout_s=5)
    poster.post(body, headers)
    poster.close()
    conn = http.client.HTTPConnection("127.0.0.1", int(server.url.split(":")[2].split("/")[0]))
    conn.request("POST", "/hook?x=1", body=body, headers=headers)
    assert conn.getresponse().status == 204
    conn.close()
    wait_for(lambda: len(server.requests) == 2)
    assert server.requests[0] == server.requests[1]
