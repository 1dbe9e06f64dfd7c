"""A small HTTP/1.1 client on asyncio streams, for the benchmark's receiver replying to the API.

Kept-alive connections per base URL, taken in turn (round robin over the API processes);
responses with a Content-Length or chunked bodies. Only what talking to our own API over
loopback needs: no TLS, no redirects, no proxies.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Origin:
    """One `http://host:port`, with its idle kept-alive connections."""

    def __init__(self, base: str) -> None:
        parts = urlsplit(base)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base!r}: only http://host:port")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.hostport = f"{self.host}:{self.port}"
        self.idle: list[Conn] = []

    async def post(self, path: str, headers: str, body: bytes) -> tuple[int, bytes]:
        """POST over an idle connection (a new one if none); the connection is kept if it can be."""
        reused = bool(self.idle)
        conn = self.idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
        try:
            status, data, keep = await self._exchange(conn, path, headers, body)
        except (OSError, asyncio.IncompleteReadError):
            conn[1].close()
            if not reused:
                raise
            conn = await asyncio.open_connection(self.host, self.port)  # it was closed: once more
            try:
                status, data, keep = await self._exchange(conn, path, headers, body)
            except BaseException:
                conn[1].close()
                raise
        except BaseException:
            conn[1].close()
            raise
        if keep:
            self.idle.append(conn)
        else:
            conn[1].close()
        return status, data

    async def _exchange(
        self, conn: Conn, path: str, headers: str, body: bytes
    ) -> tuple[int, bytes, bool]:
        reader, writer = conn
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.hostport}\r\n{headers}"
            f"content-length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip().lower()] = value.strip()
        if status < 200 or status in (204, 304):  # no body, whatever the headers say
            data = b""
        elif "content-length" in fields:
            data = await reader.readexactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            data = await _read_chunked(reader)
        else:  # read to the end: the connection can't be kept
            return status, await reader.read(), False
        return status, data, fields.get("connection", "").lower() != "close"


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers from our API
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


class Clients:
    """POSTs to several API processes in turn; answers (status, JSON object or {})."""

    def __init__(self, bases: list[str]) -> None:
        self.origins = [Origin(b) for b in bases]
        self._next = 0

    async def post(self, path: str, headers: str, body: bytes) -> tuple[int, dict[str, Any]]:
        origin = self.origins[self._next % len(self.origins)]
        self._next += 1
        status, raw = await origin.post(path, headers, body)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        return status, data if isinstance(data, dict) else {}
