"""`approval-broker up`: everything in one process group, for a laptop or a demo."""

from __future__ import annotations

import signal
import threading

import typer

from broker.config import Config, Settings
from broker.redis_server import EmbeddedRedis


def run_up(settings: Settings, config: Config, *, demo: bool = False) -> None:
    """Start the embedded Redis (unless a URL is set) and the roles that exist, until Ctrl-C."""
    embedded: EmbeddedRedis | None = None
    if not settings.redis_url:
        embedded = EmbeddedRedis(settings.data_dir and settings.data_dir / "redis")
        typer.echo(f"starting embedded Redis (AOF on) in {embedded.data_dir} ...")
        embedded.start()
        settings.redis_url = embedded.url
    typer.echo(f"Redis: {settings.redis_url}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        typer.echo("approval-broker is up; press Ctrl-C to stop.")
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if embedded:
            typer.echo("stopping embedded Redis ...")
            embedded.close()
