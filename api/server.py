"""`approval-broker api`: the app on stock uvicorn (`uvicorn.Config`, `uvicorn.Server`).

The listening socket is bound by uvicorn's own `Config.bind_socket` (SO_REUSEADDR, so a restart
right after a crash finds its port free while old connections sit in TIME_WAIT) and listens
before the app starts, so "API listening on URL" (printed by the app's start-up, port 0
included) is true the moment it is printed. Open event streams end as soon as the server starts
shutting down (they watch `Server.should_exit`), rather than hold the graceful shutdown to its
limit.

Connections: uvicorn closes an idle keep-alive connection after `KEEP_ALIVE_S`; it has no
deadline for a connection that never completes a request head (see docs: put a reverse proxy
with a header timeout in front of an API reachable from untrusted networks).
"""

from __future__ import annotations

import gc
import socket

import uvicorn
from fastapi import FastAPI

from api.app import create_app
from api.events import end_event_streams_with
from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker, sync_at_start

KEEP_ALIVE_S = 5
"""An idle keep-alive connection is closed after this (uvicorn's default, set explicitly)."""
GRACEFUL_SHUTDOWN_S = 5


def uvicorn_config(app: FastAPI, host: str, port: int, *, graceful_s: int) -> uvicorn.Config:
    """The one uvicorn configuration of the API (the server and `api.testing` share it)."""
    # No access log: email link tokens travel in the path, and secrets stay out of logs.
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=graceful_s,
        loop="uvloop",
        http="httptools",
    )


def listening_url(sock: socket.socket, host: str) -> str:
    return f"http://{host}:{sock.getsockname()[1]}"


def bound_socket(config: uvicorn.Config) -> socket.socket:
    """The API's socket, bound (uvicorn's way) and listening: connections queue from now on."""
    sock = config.bind_socket()
    sock.listen(config.backlog)
    return sock


def build_server(settings: Settings, config: Config) -> tuple[uvicorn.Server, socket.socket]:
    app = create_app(settings, config)
    uv_config = uvicorn_config(app, settings.host, settings.port, graceful_s=GRACEFUL_SHUTDOWN_S)
    server = uvicorn.Server(uv_config)
    end_event_streams_with(app, server)
    sock = bound_socket(uv_config)
    app.state.listening_url = listening_url(sock, settings.host)  # printed at start-up
    return server, sock


def sync_rules_at_start(settings: Settings, config: Config) -> None:
    """The config's `[[rules]]` into Redis before serving, on a patient client: an API
    (re)started while Redis restarts waits for it, as the other roles' start does, rather than
    exit (its own client stays impatient: a request meets a stalled Redis with a 503)."""
    starting = Broker.from_settings(settings, config, patient=True)
    try:
        sync_at_start(starting.requests.rules)
    finally:
        starting.redis.close()


def serve(settings: Settings, config: Config) -> None:
    """Serve on settings.host:settings.port until interrupted."""
    sync_rules_at_start(settings, config)  # the config's [[rules]], before serving
    server, sock = build_server(settings, config)
    gc.freeze()  # start-up's objects live for ever: full collections need not scan them again
    server.run(sockets=[sock])
