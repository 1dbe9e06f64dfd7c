"""POST one webhook delivery with httpx, under one overall deadline, reading a bounded answer.

Why an `httpx.AsyncClient` on an event loop, not a sync `Client`:
httpx's timeouts are per phase (each read may wait its full `read` timeout), so an endpoint
that drips a header byte every few seconds, sends `100 Continue` lines for ever or streams an
endless body would hold a sync client far past any timeout. Inside an `asyncio.timeout` scope
the whole exchange (connect, send, the answer's head and body) is cancelled at the deadline,
whatever phase it is in. Each endpoint has one loop thread and one client; the notifier runs
the endpoint's attempts on that loop (`apost`, see notifiers.on_loop), and a caller on another
thread hands its request over and waits at most the deadline for the answer (`post`).

What this module must never do: follow a redirect (a 3xx is the endpoint's answer, a failed
delivery), read more than `MAX_BODY` bytes of an answer, outlive the deadline, or ignore the
proxy environment (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`: httpx's `trust_env`).
A `user:pass@` in the URL is sent as basic auth (httpx's `BasicAuth`; the URL goes out without
it, as httpx's own transport sends it). aiohttp's errors that `httpx_aiohttp` leaves as they
are (an answer aiohttp refuses to parse: too many or too long headers) are httpx's
`RemoteProtocolError` here, and a refused connection (which it calls a `ConnectTimeout`) a
`ConnectError`, so the sender sees httpx's errors, named as httpx names them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ssl
import threading
import time
from dataclasses import dataclass

import aiohttp
import httpx
import uvloop
from httpx_aiohttp import HttpxAiohttpClient

MAX_BODY = 64 * 1024
"""Bytes of an answer's body read at most; a longer answer is a failed delivery."""


class UnusableURL(ValueError):
    """The endpoint's URL can never work (scheme, host, port): give up, don't retry."""


class AnswerTooLarge(Exception):
    """The answer's body passed `MAX_BODY`: it was not read to its end."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What a delivery needs of the endpoint's answer: its status and `Retry-After`."""

    status: int
    retry_after: str | None


def check_url(url: str) -> httpx.URL:
    """The URL as httpx reads it, or `UnusableURL` when no try could ever reach it."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise UnusableURL(f"{url!r}: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise UnusableURL(f"{url!r}: the scheme must be http or https")
    if not parsed.host:
        raise UnusableURL(f"{url!r}: no host")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise UnusableURL(f"{url!r}: port {parsed.port} is out of range")
    return parsed


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The system's verifying TLS context, made once (loading the CA store is costly); what
    deliveries trusted before httpx, rather than httpx's bundled CA list."""
    return ssl.create_default_context()


class Poster:
    """POSTs to one URL for every delivery thread of an endpoint: one event loop on a thread of
    its own and one `AsyncClient` (up to `connections` kept-alive connections), made on first
    use. A delivery thread hands its request to the loop and waits for the answer, so the
    network I/O of all deliveries runs on one thread (few hand-offs of the GIL per delivery).

    The loop is uvloop's (`uvloop.new_event_loop`, as the API's uvicorn runs on): the same
    POSTs cost about a seventh less CPU than on the stdlib's loop (bench/bench_notify.py
    `--transports` has both loops side by side: 231 and 199 µs with httpx's layer)."""

    def __init__(self, url: str, deadline_s: float, connections: int = 1) -> None:
        parsed = check_url(url)
        self.auth = httpx.BasicAuth(parsed.username, parsed.password) if parsed.userinfo else None
        self.url = parsed.copy_with(userinfo=b"") if parsed.userinfo else parsed
        self.deadline_s = deadline_s
        self.connections = connections
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None
        self._closed = False

    def post(self, body: bytes, headers: dict[str, str]) -> Answer:
        """Send one POST and read its answer, all within `deadline_s`.

        Raises `TimeoutError` (the deadline passed), `AnswerTooLarge`, or `httpx.HTTPError`
        (could not connect, the connection broke, the answer was not HTTP).
        """
        deadline = time.monotonic() + self.deadline_s
        loop = self._started()
        future = asyncio.run_coroutine_threadsafe(self._post(body, headers, deadline), loop)
        try:
            return future.result(timeout=self.deadline_s + 1.0)
        except concurrent.futures.TimeoutError:  # the loop itself is stuck: don't wait on it
            future.cancel()
            raise TimeoutError from None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's event loop (started on first use), where `apost` runs."""
        return self._started()

    async def apost(self, body: bytes, headers: dict[str, str]) -> Answer:
        """`post` for a caller on this poster's own loop (`loop()`): no thread in between."""
        return await self._post(body, headers, time.monotonic() + self.deadline_s)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise httpx.TransportError("this endpoint's client is closed")
            if self._loop is None:
                loop = uvloop.new_event_loop()  # see `Poster`
                self._client = _client(self.deadline_s, self.connections)
                self._thread = threading.Thread(
                    target=loop.run_forever, name="webhook-http", daemon=True
                )
                self._thread.start()
                self._loop = loop
            return self._loop

    async def _post(self, body: bytes, headers: dict[str, str], deadline: float) -> Answer:
        assert self._client is not None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(loop.time() + deadline - time.monotonic()):
                async with self._client.stream(
                    "POST", self.url, content=body, headers=headers, auth=self.auth
                ) as response:
                    read = 0
                    async for chunk in response.aiter_raw():
                        read += len(chunk)
                        if read > MAX_BODY:
                            raise AnswerTooLarge(f"the answer's body passed {MAX_BODY} bytes")
                    return Answer(response.status_code, response.headers.get("retry-after"))
        except httpx.ConnectTimeout as exc:
            if isinstance(exc.__cause__, aiohttp.ClientConnectorError):  # refused, no such host
                raise httpx.ConnectError(str(exc)) from exc.__cause__
            raise
        except aiohttp.ClientError as exc:  # what httpx_aiohttp does not map to httpx's errors
            raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Close the client's connections, stop the loop and its thread."""
        with self._lock:
            self._closed = True
            loop, client, thread = self._loop, self._client, self._thread
            self._loop = self._client = self._thread = None
        if loop is None or thread is None:
            return
        try:
            if client is not None:
                asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=5)
        except Exception:  # closing is best effort: the sockets go with the loop
            pass
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()


def _client(deadline_s: float, connections: int) -> httpx.AsyncClient:
    """No redirects followed, proxies from the environment, every phase within the deadline
    (the `asyncio.timeout` around the exchange is what bounds it as a whole).

    httpx's API on aiohttp's connections (`httpx_aiohttp.HttpxAiohttpClient`, an
    `httpx.AsyncClient` whose transports, proxied ones too, are `AiohttpTransport`s): httpx's
    own async pool cost 1.8-2.2 ms of CPU per POST at 16 in flight, this 0.3 ms
    (`bench/bench_notify.py --transports`, docs/benchmarks.md)."""
    return HttpxAiohttpClient(
        timeout=httpx.Timeout(deadline_s),
        follow_redirects=False,
        trust_env=True,
        verify=tls_context(),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )
