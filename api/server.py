"""`approval-broker api`: the app under uvicorn."""

from __future__ import annotations

import gc

import uvicorn

from api.app import create_app
from api.corked import CorkedHttpToolsProtocol
from api.events import stop_event_streams
from broker.config import Config, Settings
from broker.rules import sync_at_start


class Server(uvicorn.Server):
    """A uvicorn server that says where it listens once it really does (port 0 included), and
    ends open event streams as soon as it starts shutting down."""

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        stop_event_streams(self.config.app, stopping=False)
        await super().startup(sockets)
        gc.freeze()  # start-up's objects live for ever: full collections need not scan them again
        if self.started:
            print(f"API listening on {self.url}", flush=True)

    async def shutdown(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        """End open event streams first: they would hold the graceful shutdown to its limit."""
        stop_event_streams(self.config.app)
        await super().shutdown(sockets)

    @property
    def url(self) -> str:
        host, port = self.config.host, self.config.port
        for server in self.servers:
            for sock in server.sockets:
                port = sock.getsockname()[1]
        return f"http://{host}:{port}"


def build_server(settings: Settings, config: Config) -> Server:
    app = create_app(settings, config)
    sync_at_start(app.state.api.broker.requests.rules)  # the config's [[rules]], before serving
    # No access log: email link tokens travel in the path, and secrets stay out of logs.
    uv_config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
        loop="uvloop",
        http=CorkedHttpToolsProtocol,  # httptools, one socket write per response
    )
    return Server(uv_config)


def serve(settings: Settings, config: Config) -> None:
    """Serve on settings.host:settings.port until interrupted."""
    build_server(settings, config).run()
