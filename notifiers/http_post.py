"""One keep-alive HTTP/1.1 connection per webhook endpoint and delivery thread (raw sockets).

Webhook throughput is CPU-bound. `http.client` cost about half the CPU of httpcore per
request, and most of what was left was its header parsing through the `email` package (16% of
a busy notifier's py-spy samples): here a request is one `sendall` of bytes built once, and a
reply is a status line and `name: value` lines split by hand, its body read (up to MAX_BODY)
by Content-Length or chunks. A connection belongs to one thread, so there is no pool and no lock.

A kept-alive connection the server has closed meanwhile is found before use (its socket reads
as closed) and replaced; if the server closes it while the request goes out, the request is
sent once more on a new connection. A webhook delivery is at-least-once under one `webhook-id`
anyway, so a second send of the same bytes is what a receiver must already tolerate.
"""

from __future__ import annotations

import http.client
import select
import socket
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


class Reply:
    """A reply's status, and its head's `name: value` fields (lower-cased names) split on first
    use: a delivery that got a 2xx never looks at them."""

    __slots__ = ("status", "_rest", "_headers")

    def __init__(self, status: int, rest: str) -> None:
        self.status = status
        self._rest = rest  # the head after its status line
        self._headers: dict[str, str] | None = None

    @property
    def headers(self) -> dict[str, str]:
        if self._headers is None:
            self._headers = _fields(self._rest)
        return self._headers


class Connection:
    """One HTTP/1.1 connection, opened on first use: a socket and what was read past a reply."""

    def __init__(self, scheme: str, host: str, port: int, timeout_s: float) -> None:
        self.scheme, self.host, self.port, self.timeout_s = scheme, host, port, timeout_s
        self.sock: socket.socket | None = None
        self.buf = b""
        self.got = False  # some byte of the current reply arrived

    def open(self) -> socket.socket:
        if self.sock is None:
            sock = socket.create_connection((self.host, self.port), self.timeout_s)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.scheme == "https":
                    sock = _tls_context().wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
            self.sock = sock
        return self.sock

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


class Poster:
    """POSTs to one URL over a connection kept alive between calls (one thread's own)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.target = Target.parse(url)
        self.timeout_s = timeout_s
        self._conn: Connection | None = None
        t = self.target
        try:
            host = t.host.encode("ascii")
        except UnicodeEncodeError:
            host = t.host.encode("idna")
        if b":" in host:
            host = b"[" + host + b"]"
        default = 443 if t.scheme == "https" else 80
        self._port = t.port or default
        netloc = host if self._port == default else host + b":%d" % self._port
        if not t.path.isascii():
            raise UnusableURL(f"{url!r}: the path must be ASCII (%-encoded)")
        # the head http.client sent, in its order: Host, Accept-Encoding, Content-Length, ours
        self._head = b"POST %s HTTP/1.1\r\nHost: %s\r\nAccept-Encoding: identity\r\n" % (
            t.path.encode("ascii"),
            netloc,
        )

    def post(self, body: bytes, headers: dict[str, str]) -> Reply:
        """Send one POST; raises OSError / http.client.HTTPException when it did not get through."""
        reused = self._conn is not None and not _dropped(self._conn)
        if not reused:
            self.close()
        message = self._message(body, headers)
        try:
            return self._send(message)
        except STALE:
            if not reused:
                raise
            self.close()  # the server closed it as we sent: once more on a new one
            return self._send(message)
        except BaseException:
            self.close()
            raise

    def _message(self, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [f"Content-Length: {len(body)}\r\n"]
        lines += [f"{k}: {v}\r\n" for k, v in headers.items()]
        lines.append("\r\n")
        return b"".join((self._head, "".join(lines).encode("latin-1"), body))

    def _send(self, message: bytes) -> Reply:
        conn = self._conn or self._connect()
        self._conn = conn
        try:
            conn.open().sendall(message)
            reply, keep = _read_reply(conn)
        except BaseException:
            self.close()
            raise
        if not keep:
            self.close()
        return reply

    def _connect(self) -> Connection:
        return Connection(self.target.scheme, self.target.host, self._port, self.timeout_s)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _read_reply(conn: Connection) -> tuple[Reply, bool]:
    """The reply to the request just sent (1xx answers skipped), and whether to keep the
    connection: its body is read (up to MAX_BODY) so the next request can follow."""
    conn.got = False
    while True:
        status, version, rest = _status_line(_read_head(conn))
        if status >= 200 or status == 101:
            break
    reply, low = Reply(status, rest), "\n" + rest.lower()
    keep = version == "HTTP/1.1"
    connection = (_field(rest, low, "connection") or "").lower()
    if "close" in connection:
        keep = False
    elif "keep-alive" in connection:
        keep = True
    if status in (204, 304) or 100 <= status < 200:
        return reply, keep and status != 101
    if "chunked" in (_field(rest, low, "transfer-encoding") or "").lower():
        return reply, keep and _skip_chunked(conn)
    length = _field(rest, low, "content-length")
    if length is None:  # the body runs to the end of the connection
        return reply, False
    try:
        size = int(length)
    except ValueError:
        raise http.client.HTTPException(f"bad content-length {length!r}") from None
    if size < 0 or size > MAX_BODY:  # more than we read: don't reuse it
        return reply, False
    _take(conn, size)
    return reply, keep


def _recv(conn: Connection) -> bytes:
    """More bytes; the peer hanging up before any byte of the reply is `RemoteDisconnected`
    (a kept connection cut: sent again), after some of it `IncompleteRead` (not sent again)."""
    assert conn.sock is not None
    try:
        data = conn.sock.recv(65536)
    except OSError as exc:  # a reset after part of the reply: the server had the request
        if conn.buf or conn.got:
            raise http.client.IncompleteRead(conn.buf) from exc
        raise
    if not data:
        if conn.buf or conn.got:
            raise http.client.IncompleteRead(conn.buf)
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    conn.got = True
    return data


def _read_head(conn: Connection) -> bytes:
    buf = conn.buf
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            conn.buf = buf[end + 4 :]
            return buf[:end]
        if len(buf) > MAX_BODY:
            raise http.client.HTTPException("response headers too long")
        buf += _recv(conn)


def _status_line(head: bytes) -> tuple[int, str, str]:
    """Status, version, and the rest of the head (its fields) as text."""
    line, _, rest = head.decode("latin-1").partition("\r\n")
    version, _, status = line.partition(" ")
    code = status[:3]
    if not version.startswith("HTTP/") or not (code.isascii() and code.isdigit()):
        raise http.client.BadStatusLine(line)
    return int(code), version, rest


def _fields(rest: str) -> dict[str, str]:
    """`name: value` lines (names lower-cased; a line without a name is skipped, the last of
    a name wins), as the regex the poster used read them (tests/test_notify_hotpath.py)."""
    headers: dict[str, str] = {}
    for field in rest.split("\n"):
        name, colon, value = field.partition(":")
        name = name.rstrip(" \t")
        if colon and name and "\r" not in name:
            headers[name.lower()] = value.split("\r", 1)[0].strip()
    return headers


def _field(rest: str, low: str, name: str) -> str | None:
    """`_fields(rest).get(name)` without splitting every line (`low` is "\\n" + rest lower-cased):
    the last line starting with the name, when a colon follows it; else the long way."""
    at = low.rfind("\n" + name)
    if at < 0:
        return None
    end = at + 1 + len(name)
    colon = len(low[end:]) - len(low[end:].lstrip(" \t")) + end
    if low.startswith(":", colon):
        stop = low.find("\n", colon)
        value = rest[colon : stop - 1 if stop >= 0 else None]  # `low` is one longer
        return value.split("\r", 1)[0].strip()
    return _fields(rest).get(name)


def _take(conn: Connection, size: int) -> bytes:
    while len(conn.buf) < size:
        conn.buf += _recv(conn)
    data, conn.buf = conn.buf[:size], conn.buf[size:]
    return data


def _line(conn: Connection) -> bytes:
    while b"\r\n" not in conn.buf:
        if len(conn.buf) > MAX_BODY:
            raise http.client.HTTPException("chunk line too long")
        conn.buf += _recv(conn)
    line, _, conn.buf = conn.buf.partition(b"\r\n")
    return line


def _skip_chunked(conn: Connection) -> bool:
    """Read a chunked body; False when it is longer than MAX_BODY (the connection is dropped)."""
    total = 0
    while True:
        digits = _line(conn).split(b";", 1)[0].strip()
        try:
            size = int(digits, 16)
        except ValueError:
            raise http.client.HTTPException("bad chunk size") from None
        if size < 0 or digits.startswith((b"-", b"+")):
            raise http.client.HTTPException(f"bad chunk size {digits!r}")
        if size == 0:
            while _line(conn):  # trailers, up to the empty line
                pass
            return True
        total += size
        if total > MAX_BODY:
            return False
        _take(conn, size + 2)


_tls: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every connection (loading the CA store is costly)."""
    global _tls
    with _tls_lock:
        if _tls is None:
            _tls = ssl.create_default_context()
        return _tls


def _dropped(conn: Connection) -> bool:
    """Whether an idle kept-alive connection was closed by the server (readable = EOF or junk)."""
    sock = conn.sock
    if sock is None or conn.buf:  # never opened, or the server sent more than its reply
        return True
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True
