"""One socket write per response (api.corked): the same bytes, in order, in fewer writes.

A recording transport stands in for the socket in the unit cases; the server cases go through
uvicorn on the corked protocol (api.testing.ServerThread serves with it, as api.server does).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse

from api.corked import CorkedTransport
from api.testing import ServerThread


class Recording:
    """What a socket transport was asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", None))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("peer", name)


def test_writes_of_one_iteration_go_out_as_one_in_order() -> None:
    async def scenario() -> list[tuple[str, Any]]:
        raw = Recording()
        corked = CorkedTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        corked.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        corked.write(b"")  # nothing to send: no write
        corked.write(bytearray(b"ok"))
        assert raw.calls == []  # held until the iteration ends
        assert corked.get_write_buffer_size() == 40
        await asyncio.sleep(0)
        corked.write(b"next")
        await asyncio.sleep(0)
        assert corked.get_extra_info("peername") == ("peer", "peername")  # delegated
        return raw.calls

    assert asyncio.run(scenario()) == [
        ("write", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"),
        ("write", b"next"),
    ]


def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    async def scenario() -> tuple[list[Any], list[Any]]:
        loop = asyncio.get_running_loop()
        closed, aborted = Recording(), Recording()
        one = CorkedTransport(closed, loop)  # type: ignore[arg-type]
        one.write(b"bye")
        one.close()
        two = CorkedTransport(aborted, loop)  # type: ignore[arg-type]
        two.write(b"lost")
        two.abort()
        await asyncio.sleep(0)  # the scheduled flushes find nothing left
        return closed.calls, aborted.calls

    closed, aborted = asyncio.run(scenario())
    assert closed == [("write", b"bye"), ("close", None)]
    assert aborted == [("abort", None)]


@pytest.fixture
def url() -> Any:
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> PlainTextResponse:
        return PlainTextResponse("hello")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def parts() -> Any:
            for part in (b"one,", b"two,", b"three"):
                yield part
                await asyncio.sleep(0.01)

        return StreamingResponse(parts(), media_type="text/plain")

    with ServerThread(app) as server:
        yield server.url


def _exchange(url: str, raw: bytes, until: bytes) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        got = b""
        while until not in got:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_pipelined_keep_alive_requests_get_their_answers_in_order(url: str) -> None:
    one = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
    got = _exchange(url, one * 3 + b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n", b"0\r\n\r\n")
    assert got.count(b"HTTP/1.1 200 OK") == 4
    assert got.count(b"\r\n\r\nhello") == 3
    assert got.index(b"hello") < got.index(b"one,")
    body = got.split(b"transfer-encoding: chunked\r\n", 1)[1]
    assert [part for part in body.split(b"\r\n") if part.isalpha() or part.endswith(b",")] == [
        b"one,", b"two,", b"three",
    ]  # fmt: skip
