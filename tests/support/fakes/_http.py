"""A small threaded HTTP/1.1 server base for the fakes (keep-alive, loopback, any free port)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return None

    def read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def reply(
        self,
        status: int,
        body: bytes | str | dict[str, Any] = b"",
        headers: dict[str, str] | None = None,
    ) -> None:
        if isinstance(body, dict):
            payload = json.dumps(body).encode()
            content_type = "application/json; charset=utf-8"
        else:
            payload = body.encode() if isinstance(body, str) else body
            content_type = "text/plain; charset=utf-8"
        try:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
            self.close_connection = True


class ServerThread:
    """Runs a ThreadingHTTPServer on 127.0.0.1 in a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], owner: Any, port: int = 0) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        self.server.owner = owner  # type: ignore[attr-defined]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_until_stopped(server: Any) -> None:
    """For a fake run as its own process: serve until SIGTERM or Ctrl-C, then stop and exit 0."""
    import signal
    import sys
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    sys.exit(0)
