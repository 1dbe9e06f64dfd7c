"""Delivery side: a webhook endpoint's kept-alive connection per delivery thread (httpx), the
delivery pools, in-flight entries freed without the cyclic GC, and the e2e benchmark's backlog
kept from the notifiers."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvloop
from redis import Redis

from broker.domain.events import REQUESTED, parse_entry
from broker.facade import Broker
from broker.store.keys import NOTIFIER_GROUP
from channels.retry import GiveUp, Retry
from channels.webhook.config import WebhookConfig
from channels.webhook.http import Poster, UnusableURL
from channels.webhook.sender import WebhookSender
from notifiers.inflight import Inflight
from notifiers.pool import DeliveryPool
from notifiers.tasks import InflightEntry, Task
from tests.support.waiting import wait_for

SECRET = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="


class Server(ThreadingHTTPServer):
    """Loopback HTTP/1.1 server; `mode` says what it does to a kept-alive connection."""

    daemon_threads = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = mode  # "keep" | "close-after" (closes quietly after each answer)
        # | "cut-second" (reads a connection's second request, then closes without answering)
        self.connections = 0
        self.closed = 0  # connections this server has finished with
        self.requests: list[bytes] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        self.seen = 0
        with self.server.lock:
            self.server.connections += 1

    def finish(self) -> None:
        super().finish()
        with self.server.lock:
            self.server.closed += 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.seen += 1
        with self.server.lock:
            self.server.requests.append(body)
        if self.server.mode == "cut-second" and self.seen == 2:
            self.close_connection = True
            return
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()
        if self.server.mode == "close-after":
            self.close_connection = True  # no "Connection: close": the client finds out later

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Server] = []

    def start(mode: str) -> Server:
        server = Server(mode)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_sender_keeps_one_connection_alive_across_posts(serve: Any) -> None:
    server = serve("keep")
    sender = Poster(server.url, deadline_s=5)
    try:
        statuses = [sender.post(b'{"n": %d}' % i, {}).status for i in range(5)]
    finally:
        sender.close()
    assert statuses == [204] * 5
    assert server.connections == 1
    assert server.requests == [b'{"n": %d}' % i for i in range(5)]


def test_an_endpoints_posts_run_on_a_uvloop_loop_of_its_own(serve: Any) -> None:
    """The endpoint's client runs on uvloop (less CPU per POST than the stdlib's loop), in a
    thread of its own, and answers there and to a caller on another thread."""
    server = serve("keep")
    sender = Poster(server.url, deadline_s=5)
    try:
        loop = sender.loop()
        assert isinstance(loop, uvloop.Loop)
        answer = asyncio.run_coroutine_threadsafe(sender.apost(b"on-loop", {}), loop).result(5)
        assert answer.status == 204
        assert sender.post(b"from-a-thread", {}).status == 204
    finally:
        sender.close()
    assert server.requests == [b"on-loop", b"from-a-thread"]


def test_a_sender_replaces_a_connection_the_server_closed_while_idle(serve: Any) -> None:
    server = serve("close-after")
    sender = Poster(server.url, deadline_s=5)
    try:
        statuses = []
        for i in range(3):
            statuses.append(sender.post(b"x%d" % i, {}).status)
            wait_for(lambda n=i + 1: server.closed == n)
    finally:
        sender.close()
    assert statuses == [204, 204, 204]
    assert server.connections == 3
    assert len(server.requests) == 3  # each sent once: the dead connection was never written to


def test_a_kept_connection_cut_under_a_request_fails_that_try_and_the_next_goes_out_anew(
    serve: Any,
) -> None:
    """The server takes the second request of a connection and hangs up: that try fails (it is
    retried after the back-off, same bytes, as every failed webhook delivery) and the next
    goes out on a new connection."""
    server = serve("cut-second")
    sender = Poster(server.url, deadline_s=5)
    try:
        assert sender.post(b"first", {}).status == 204
        with pytest.raises(httpx.HTTPError):
            sender.post(b"second", {})
        assert sender.post(b"second", {}).status == 204
    finally:
        sender.close()
    assert server.requests == [b"first", b"second", b"second"]
    assert server.connections == 2


def test_a_sender_refuses_urls_that_can_never_work() -> None:
    for url in ("ftp://example.com/x", "http:///nohost", "http://example.com:99999/"):
        with pytest.raises(UnusableURL):
            Poster(url, deadline_s=1)


def _task() -> Task:
    fields = {"type": REQUESTED, "request_id": "r1"}
    event = parse_entry("s", "default", "1-0", fields)
    from broker.domain.models import Request  # a stand-in request is never read by these tests

    entry = InflightEntry(event, Request.model_construct(id="r1"))
    task = Task(entry, "webhook:ops")
    entry.tasks = [task]
    return task


def test_webhook_channel_gives_up_on_a_bad_url_and_retries_a_refused_connection(
    broker: Broker,
) -> None:

    state = broker.deliveries
    task = _task()
    task.scratch["body"] = '{"type": "approval.requested"}'
    bad = WebhookSender(
        "webhook:bad", WebhookConfig(url="ftp://x/y", secret=SECRET), state, concurrency=1
    )
    with pytest.raises(GiveUp, match="unusable URL"):
        bad.deliver(task)
    refused = WebhookSender(
        "webhook:down",
        WebhookConfig(url="http://127.0.0.1:1/hook", secret=SECRET, timeout_s=2),
        state,
        concurrency=1,
    )
    with pytest.raises(Retry, match="ConnectError"):
        refused.deliver(task)
    bad.close()
    refused.close()


def test_delivery_pool_runs_on_its_threads_and_shutdown_drops_only_queued_calls() -> None:
    pool = DeliveryPool(2, "test-pool")
    gate = threading.Event()
    running: list[str] = []
    finished: list[int] = []
    lock = threading.Lock()

    def call(n: int) -> None:
        with lock:
            running.append(threading.current_thread().name)
        gate.wait(10)
        with lock:
            finished.append(n)

    for n in range(4):
        pool.submit(call, n)
    wait_for(lambda: len(running) == 2)
    assert len(set(running)) == 2 and all(t.startswith("test-pool_") for t in running)
    closer = threading.Thread(target=pool.shutdown)
    closer.start()
    wait_for(lambda: pool._closed)
    with pytest.raises(RuntimeError):
        pool.submit(call, 9)
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert sorted(finished) == [0, 1]  # the two running ones finished; the queued two dropped
    assert len(running) == 2


def test_an_acknowledged_entry_is_freed_without_the_cyclic_gc() -> None:
    inflight = Inflight(10)
    task = _task()
    entry = task.entry
    inflight.add(entry)
    gone = weakref.ref(entry)
    seen = entry.tasks  # a thread looking at the list keeps seeing it
    gc.disable()
    try:
        inflight.done([entry])
        assert seen == [task] and entry.tasks == []
        del task, entry, seen
        assert gone() is None
    finally:
        gc.enable()


def test_the_e2e_backlog_stays_out_of_the_notifiers_sight_until_the_rewind(
    redis: Redis, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3] / "bench"))
    from bench_e2e import make_backlog

    make_backlog(broker, 3)
    stream = broker.keys.stream("default")
    (group,) = redis.xinfo_groups(stream)
    last = redis.xrevrange(stream, count=1)[0][0]
    assert group["last-delivered-id"] == last
    assert redis.xreadgroup(NOTIFIER_GROUP, "probe", {stream: ">"}) == []
    redis.xgroup_setid(stream, NOTIFIER_GROUP, "0")
    ((_, entries),) = redis.xreadgroup(NOTIFIER_GROUP, "probe", {stream: ">"})
    assert len(entries) == 3
