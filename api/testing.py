"""Helpers for tests and benchmarks: run an app under a real uvicorn server in a thread."""

from __future__ import annotations

import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from api.server import Server


class ServerThread:
    """`with ServerThread(app) as server:` serves `app` on a free loopback port at `server.url`."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        config = uvicorn.Config(
            app, host=host, port=0, access_log=False, log_level="warning",
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        self.server = Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.timeout = timeout

    @property
    def url(self) -> str:
        return self.server.url

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

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
