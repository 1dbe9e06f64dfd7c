"""Helpers for tests and benchmarks: run an app under a real uvicorn server in a thread."""

from __future__ import annotations

import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from api.events import end_event_streams_with
from api.server import bound_socket, listening_url, uvicorn_config


class ServerThread:
    """`with ServerThread(app) as server:` serves `app` on a free loopback port at `server.url`,
    configured as `api.server` serves it (stock uvicorn; signals stay the main thread's)."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        config = uvicorn_config(app, host, 0, graceful_s=1)
        self.server = uvicorn.Server(config)
        end_event_streams_with(app, self.server)
        self.socket = bound_socket(config)
        self.url = listening_url(self.socket, host)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )
        self.timeout = timeout

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + self.timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(self.timeout)
        self.socket.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
