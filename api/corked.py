"""One socket write per response: uvicorn's httptools protocol on a corked transport (issue 18).

uvicorn writes a response's status line and headers, then its body, as two `transport.write`
calls, each a `send()` to the kernel; on loopback the first already wakes the client. In a
py-spy profile of the API those two writes were about a quarter of its CPU per decision. Here
the writes one connection makes in one event-loop iteration are held and sent together at the
end of it (`call_soon`), in order; closing, or ending the write side, sends what is held
first, and aborting drops it as the transport itself would. Nothing else changes: the bytes
on the wire are the same, only fewer segments carry them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CorkedTransport:
    """A transport whose writes of one loop iteration go out as one; the rest is delegated."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held is None:
            self._held = [bytes(data)]
            self._loop.call_soon(self.flush)
        else:
            self._held.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Send what is held, as one write (a no-op once the transport is closing)."""
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        held = sum(len(data) for data in self._held) if self._held else 0
        return held + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `CorkedTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        corked = CorkedTransport(transport, self.loop)
        super().connection_made(corked)  # type: ignore[arg-type]
