"""Raw client connections that stall, to see whether a server closes them (and how soon)."""

from __future__ import annotations

import selectors
import socket
import time


def connect(address: tuple[str, int], send: bytes) -> socket.socket:
    """A connection that sends `send` (maybe half a request, maybe nothing) and then waits."""
    sock = socket.create_connection(address, timeout=5)
    if send:
        sock.sendall(send)
    return sock


def closed_by_server(sockets: list[socket.socket], timeout: float) -> int:
    """How many of `sockets` the server closed (EOF or reset) within `timeout` seconds; what
    it sends before closing (an answer, an error page) is read and dropped."""
    open_ = set(sockets)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            selector.register(sock, selectors.EVENT_READ)
        while open_ and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except ConnectionError:
                    data = b""
                if not data:
                    selector.unregister(sock)
                    open_.discard(sock)
    return len(sockets) - len(open_)
