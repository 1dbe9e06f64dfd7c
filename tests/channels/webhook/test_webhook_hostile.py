"""A hostile webhook endpoint cannot hold a delivery past its deadline, nor starve another one.

The endpoint here is a raw socket server written for the test: it plays the hostile far end
(answers slowly, never finishes its body, drips its head a byte at a time, sends `100
Continue` for ever, sends huge headers, redirects, streams an endless chunked body or endless
trailers). Each try must end within the endpoint's deadline (plus a second of slack), the
delivery is tried again on the endpoint's back-off schedule and then dead-lettered, no delivery
thread is still busy after the deadline, and a second, healthy endpoint served by the same
dispatcher keeps getting its deliveries promptly all along.

Also here: `user:pass@` in an endpoint's URL is sent as basic auth, the proxy environment is
honoured, and every try of one delivery carries the same `webhook-id` and body.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from broker.domain.events import REQUESTED, parse_entry
from broker.domain.models import Request
from broker.facade import Broker
from channels.webhook.config import WebhookConfig
from channels.webhook.sender import WebhookSender
from notifiers.dispatch import Dispatcher
from notifiers.parking import ParkedStore
from notifiers.results import DeliveryResult, ResultKind
from notifiers.tasks import InflightEntry, Task
from tests.support.waiting import wait_for

SECRET = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
DEADLINE_S = 3.0
"""The hostile endpoint's `timeout_s`. Longer than the 2 s between dripped bytes, so that
only an overall deadline ends that try (a per-read timeout never fires)."""
SLACK_S = 1.0
ATTEMPTS = 2
BACKOFF_S = 0.4

# ---- the hostile far end ----------------------------------------------------------------


def _slow(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(30)  # answers, eventually
    conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")


def _unfinished_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
    stop.wait(30)


def _drip_head(conn: socket.socket, stop: threading.Event) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
        conn.sendall(bytes([byte]))
        if stop.wait(2.0):
            return


def _endless_continue(conn: socket.socket, stop: threading.Event) -> None:
    while not stop.wait(0.01):
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


def _huge_headers(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    line = b"X-Big: " + b"a" * 8000 + b"\r\n"
    while not stop.is_set():
        conn.sendall(line)


def _endless_chunks(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"1000\r\n" + b"z" * 0x1000 + b"\r\n"
    while not stop.is_set():
        conn.sendall(chunk)


def _slow_endless_chunks(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while not stop.wait(0.2):
        conn.sendall(b"1\r\nz\r\n")


def _endless_trailers(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n")
    while not stop.wait(0.001):
        conn.sendall(b"X-Trailer: " + b"t" * 1000 + b"\r\n")


BEHAVIOURS: dict[str, Callable[[socket.socket, threading.Event], None]] = {
    "answers_slowly": _slow,
    "never_finishes_its_body": _unfinished_body,
    "drips_a_head_byte_every_2s": _drip_head,
    "sends_endless_100_continue": _endless_continue,
    "sends_huge_headers": _huge_headers,
    "streams_an_endless_chunked_body": _endless_chunks,
    "drips_an_endless_chunked_body": _slow_endless_chunks,
    "sends_endless_trailers": _endless_trailers,
}


class Hostile:
    """Reads each request's head and body, then plays `behaviour` on the connection (or, for
    `redirect`, answers 302 to `location`)."""

    def __init__(self, behaviour: str, location: str = "") -> None:
        self.behaviour = behaviour
        self.location = location
        self.stop = threading.Event()
        self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        try:
            while not self.stop.is_set():
                if not _read_request(conn):
                    return
                with self._lock:
                    self.requests += 1
                if self.behaviour == "redirect":
                    conn.sendall(
                        b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n"
                        % self.location.encode()
                    )
                    continue
                BEHAVIOURS[self.behaviour](conn, self.stop)
                return
        except OSError:  # the client gave up on us: what it should do
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        with self._lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def _read_request(conn: socket.socket) -> bytes | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        data = conn.recv(65536)
        if not data:
            return None
        body += data
    return head


# ---- a well-behaved endpoint ------------------------------------------------------------


class Healthy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HealthyHandler)
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.fail_first = 0  # answer this many requests 500 first

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/ok"


class _HealthyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Healthy

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with self.server.lock:
            self.server.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
            failing = self.server.fail_first > 0
            self.server.fail_first -= 1
        self.send_response(500 if failing else 204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def healthy() -> Iterator[Healthy]:
    server = Healthy()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


# ---- the dispatcher under test ----------------------------------------------------------


class Timed(WebhookSender):
    """A webhook channel that records how long each try took and how it ended."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tries: list[tuple[float, float, str]] = []  # (start, end, outcome)
        self.threads: list[str] = []  # the thread each try ran on
        self._tries_lock = threading.Lock()

    def deliver(self, task: Task) -> str | None:
        start = time.monotonic()
        outcome = "ok"
        try:
            return super().deliver(task)
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            with self._tries_lock:
                self.tries.append((start, time.monotonic(), outcome))
                self.threads.append(threading.current_thread().name)

    async def adeliver(self, task: Task) -> str | None:  # what the notifier calls
        start = time.monotonic()
        outcome = "ok"
        try:
            return await super().adeliver(task)
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            with self._tries_lock:
                self.tries.append((start, time.monotonic(), outcome))
                self.threads.append(threading.current_thread().name)


@dataclass
class Run:
    dispatcher: Dispatcher
    results: list[tuple[float, DeliveryResult]] = field(default_factory=list)
    dead: list[tuple[float, str, str]] = field(default_factory=list)  # (when, channel, error)

    def settled(self, channel: str) -> list[DeliveryResult]:
        return [
            r
            for _, r in self.results
            if r.channel == channel and r.kind in (ResultKind.delivered, ResultKind.dead)
        ]


def _task(rid: str, channel: str) -> Task:
    event = parse_entry("s", "default", "1-0", {"type": REQUESTED, "request_id": rid})
    entry = InflightEntry(event, Request.model_construct(id=rid))
    task = Task(entry, channel)
    task.scratch["body"] = json.dumps({"type": "approval.requested", "data": {"id": rid}})
    entry.tasks = [task]
    return task


def _dispatcher(broker: Broker, channels: dict[str, WebhookSender]) -> Run:
    run = Run(dispatcher=None)  # type: ignore[arg-type]
    lock = threading.Lock()

    def report(result: DeliveryResult) -> None:
        with lock:
            run.results.append((time.monotonic(), result))

    def dead_letter(task: Task, error: str) -> None:
        with lock:
            run.dead.append((time.monotonic(), task.channel, error))

    run.dispatcher = Dispatcher(
        dict(channels), report, dead_letter, ParkedStore(broker, lease_s=30)
    )
    return run


def _hostile_channel(broker: Broker, url: str) -> Timed:
    config = WebhookConfig(
        url=url,
        secret=SECRET,
        timeout_s=DEADLINE_S,
        max_attempts=ATTEMPTS,
        backoff_s=BACKOFF_S,
        max_backoff_s=BACKOFF_S,
    )
    return Timed("webhook:hostile", config, broker.deliveries, concurrency=2)


def _healthy_channel(broker: Broker, url: str, **extra: Any) -> Timed:
    config = WebhookConfig(url=url, secret=SECRET, timeout_s=DEADLINE_S, **extra)
    return Timed("webhook:healthy", config, broker.deliveries, concurrency=2)


def test_a_webhook_attempt_runs_on_its_endpoints_loop_without_a_delivery_thread(
    broker: Broker, healthy: Healthy
) -> None:
    good = _healthy_channel(broker, healthy.url)
    run = _dispatcher(broker, {good.name: good})
    try:
        for n in range(3):
            run.dispatcher.submit(_task(f"loop-{n}", good.name))
        wait_for(lambda: len(run.settled(good.name)) == 3, timeout=10)
        assert len(healthy.got) == 3
        assert set(good.threads) == {"webhook-http"}  # the endpoint client's loop thread
        pool_threads = [t for t in threading.enumerate() if t.name.startswith("notify-webhook")]
        assert pool_threads == []  # no delivery thread was started for it
        assert run.dispatcher.load(good.name) == 0
    finally:
        run.dispatcher.close()
        good.close()


@pytest.mark.parametrize("behaviour", [*BEHAVIOURS, "redirect"])
def test_a_hostile_endpoint_fails_within_its_deadline_and_another_keeps_its_pace(
    broker: Broker, healthy: Healthy, behaviour: str
) -> None:
    hostile = Hostile(behaviour, location=healthy.url)
    bad = _hostile_channel(broker, hostile.url)
    good = _healthy_channel(broker, healthy.url)
    run = _dispatcher(broker, {bad.name: bad, good.name: good})
    try:
        began = time.monotonic()
        for n in range(2):  # both of its delivery threads busy with it
            run.dispatcher.submit(_task(f"bad-{n}", bad.name))
        # meanwhile the healthy endpoint gets a delivery every 50 ms, each promptly
        latencies: list[float] = []
        n = 0
        limit = began + ATTEMPTS * (DEADLINE_S + SLACK_S) + 2 * BACKOFF_S + 5
        while len(run.dead) < 2 and time.monotonic() < limit:
            task = _task(f"good-{n}", good.name)
            sent = time.monotonic()
            run.dispatcher.submit(task)
            wait_for(lambda k=n + 1: len(run.settled(good.name)) == k, timeout=5)
            latencies.append(time.monotonic() - sent)
            n += 1
            time.sleep(0.05)  # the healthy endpoint's own pace, not a synchronisation
        wait_for(lambda: len(run.dead) == 2, timeout=1)
        ended = time.monotonic()

        # every try of the hostile endpoint ended within its deadline, and failed
        assert len(bad.tries) == 2 * ATTEMPTS, bad.tries
        for start, end, outcome in bad.tries:
            assert end - start <= DEADLINE_S + SLACK_S, [(e - s, o) for s, e, o in bad.tries]
            assert outcome.startswith("Retry"), outcome
        # tried again on its back-off schedule, then dead-lettered
        assert all(channel == bad.name for _, channel, _ in run.dead)
        assert all(f"gave up after {ATTEMPTS} attempts" in error for _, _, error in run.dead)
        failed = [r for _, r in run.results if r.kind is ResultKind.attempt_failed]
        assert len(failed) == 2 * ATTEMPTS
        assert ended - began <= ATTEMPTS * (DEADLINE_S + SLACK_S) + BACKOFF_S + SLACK_S
        # no delivery thread is still held by it (an attempt is counted out just after its
        # dead letter is recorded, on the delivery's own thread or loop)
        wait_for(lambda: run.dispatcher.load(bad.name) == 0, timeout=1)
        # the healthy endpoint got every delivery, each promptly, all along
        assert n >= 1 and len(healthy.got) == n
        # a delivery stuck behind the hostile one would take its whole deadline
        assert max(latencies) < DEADLINE_S, latencies
        if behaviour == "redirect":  # not followed: the healthy server saw none of its bodies
            assert all(b"bad-" not in body for _, body in healthy.got)
            assert hostile.requests == 2 * ATTEMPTS
    finally:
        hostile.close()
        closing = time.monotonic()
        run.dispatcher.close()
        bad.close()
        good.close()
    assert time.monotonic() - closing < DEADLINE_S + SLACK_S  # nothing left hanging


def test_every_try_carries_the_same_webhook_id_and_body(broker: Broker, healthy: Healthy) -> None:
    healthy.fail_first = 2
    good = _healthy_channel(broker, healthy.url, backoff_s=0.05, max_backoff_s=0.05)
    run = _dispatcher(broker, {good.name: good})
    try:
        run.dispatcher.submit(_task("same-1", good.name))
        wait_for(lambda: len(run.settled(good.name)) == 1)
    finally:
        run.dispatcher.close()
        good.close()
    assert [r.kind for _, r in run.results] == [
        ResultKind.attempt_failed,
        ResultKind.attempt_failed,
        ResultKind.delivered,
    ]
    assert len(healthy.got) == 3
    assert len({headers["webhook-id"] for headers, _ in healthy.got}) == 1
    assert len({body for _, body in healthy.got}) == 1


def test_user_and_password_in_the_url_are_sent_as_basic_auth(
    broker: Broker, healthy: Healthy
) -> None:
    url = healthy.url.replace("http://", "http://hook-user:s%40cret@")
    good = _healthy_channel(broker, url)
    try:
        assert good.deliver(_task("auth-1", good.name)).startswith(REQUESTED)
    finally:
        good.close()
    ((headers, _),) = healthy.got
    assert headers["authorization"] == "Basic " + base64.b64encode(b"hook-user:s@cret").decode()


class _Proxy(Healthy):
    """A forward proxy stand-in: records the request line it was sent and answers 204."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.RequestHandlerClass = _ProxyHandler


class _ProxyHandler(_HealthyHandler):
    server: _Proxy

    def do_POST(self) -> None:
        self.server.lines.append(self.requestline)
        super().do_POST()


def test_deliveries_go_through_the_proxy_the_environment_names(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = _Proxy()
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    channel = _healthy_channel(broker, "http://hooks.example.test/approvals")
    try:
        assert channel.deliver(_task("proxied-1", channel.name)).startswith(REQUESTED)
    finally:
        channel.close()
        proxy.shutdown()
        proxy.server_close()
    assert proxy.lines == ["POST http://hooks.example.test/approvals HTTP/1.1"]
