"""One keep-alive HTTP/1.1 connection per webhook endpoint and delivery thread (http.client).

Webhook throughput is CPU-bound, and the standard library's `http.client` costs about half the
CPU of httpcore per request (measured: 97-141 vs 222-274 us of client CPU per POST to a local
uvicorn). A connection belongs to one thread, so there is no pool and no lock.

A kept-alive connection the server has closed meanwhile is found before use (its socket reads
as closed) and replaced; if the server closes it while the request goes out, the request is
sent once more on a new connection. A webhook delivery is at-least-once under one `webhook-id`
anyway, so a second send of the same bytes is what a receiver must already tolerate.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_BODY = 64 * 1024
"""Response bytes read to keep the connection; a longer answer closes it instead."""

STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class UnusableURL(ValueError):
    """The endpoint's URL can never work (scheme, host): give up, don't retry."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int | None
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise UnusableURL(f"{url!r}: {exc}") from None
        if parts.scheme not in ("http", "https"):
            raise UnusableURL(f"{url!r}: the scheme must be http or https")
        if not parts.hostname:
            raise UnusableURL(f"{url!r}: no host")
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        return cls(parts.scheme, parts.hostname, port, path)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-cased names


class Poster:
    """POSTs to one URL over a connection kept alive between calls (one thread's own)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.target = Target.parse(url)
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, headers: dict[str, str]) -> Reply:
        """Send one POST; raises OSError / http.client.HTTPException when it did not get through."""
        reused = self._conn is not None and not _dropped(self._conn)
        if not reused:
            self.close()
        try:
            return self._send(body, headers)
        except STALE:
            if not reused:
                raise
            self.close()  # the server closed it as we sent: once more on a new one
            return self._send(body, headers)
        except BaseException:
            self.close()
            raise

    def _send(self, body: bytes, headers: dict[str, str]) -> Reply:
        conn = self._conn or self._connect()
        self._conn = conn
        try:
            conn.request("POST", self.target.path, body=body, headers=headers)
            response = conn.getresponse()
            response.read(MAX_BODY)
        except BaseException:
            self.close()
            raise
        if not response.isclosed():  # more than we read, or no length: don't reuse it
            self.close()
        elif response.will_close:
            self.close()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()})

    def _connect(self) -> http.client.HTTPConnection:
        t = self.target
        # the port always given: http.client would split a bare IPv6 host at its last colon
        port = t.port or (443 if t.scheme == "https" else 80)
        if t.scheme == "https":
            return http.client.HTTPSConnection(
                t.host, port, timeout=self.timeout_s, context=_tls_context()
            )
        return http.client.HTTPConnection(t.host, port, timeout=self.timeout_s)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


_tls: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every connection (loading the CA store is costly)."""
    global _tls
    with _tls_lock:
        if _tls is None:
            _tls = ssl.create_default_context()
        return _tls


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection was closed by the server (readable = EOF or junk)."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True
