"""`approval-broker notifier`: build the senders of the channels the config names (each by
its kind's plugin) and run the consumer loop."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from types import FrameType

import typer

from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from channels import check_installed, plugin
from channels.sender import Sender
from notifiers.consumer import Notifier, default_name
from notifiers.host import NotifierHost
from notifiers.options import NotifierOptions

GC_YOUNG = 10_000
"""Young objects before a collection (Python's default: 700). Nearly everything a delivery
makes is freed by refcount; at 700 the young collections and the older ones they fed were 61
ms of CPU per 10,000 deliveries (a `gc.callbacks` hook during `bench_notify.py`), at
10,000 16 ms, each collection a few ms."""


def used_channels(config: Config) -> list[str]:
    """Every channel some queue names, plus every webhook (any may be a request's callback)."""
    names = [c for q in config.queues.values() for c in q.channels]
    names += config.callback_channels()
    return list(dict.fromkeys(names))


def check_config(config: Config) -> None:
    """Each channel kind in use: its dependencies installed (its extra), and what only its
    senders read of the config (`ChannelPlugin.check`), before the notifier connects anywhere."""
    check_installed(config)
    for kind in sorted({name.partition(":")[0] for name in used_channels(config)}):
        plugin(kind).check(config)


def build_channels(
    broker: Broker, config: Config, options: NotifierOptions, consumer: str
) -> dict[str, Sender]:
    """One sender per channel name in use, made by its kind's plugin (`channels.plugin`)."""
    check_config(config)
    host = NotifierHost(broker, config, options, consumer)
    return {
        name: plugin(name.partition(":")[0]).sender(name, host) for name in used_channels(config)
    }


def start_notifier(
    broker: Broker, options: NotifierOptions | None = None, *, name: str | None = None
) -> Notifier:
    """A running notifier on `broker` (for `up`, tests and benchmarks); call `.stop()` after."""
    options = options or NotifierOptions()
    name = name or options.name or default_name()
    channels = build_channels(broker, broker.config, options, name)
    return Notifier(broker, channels, options, name=name).start()


def run_notifier(settings: Settings, config: Config) -> None:
    """Run one notifier until SIGTERM or Ctrl-C, then finish what is in flight (briefly).

    A notifier whose bookkeeping broke stops itself; the process then exits with status 1, so
    a supervisor restarts it (its unacknowledged entries are reclaimed meanwhile).
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    check_config(config)
    options = NotifierOptions()
    assert settings.redis_url, "the CLI fills in redis_url"
    broker = Broker.from_settings(settings, config, patient=True)
    broker.fleet.ping()
    notifier = start_notifier(broker, options)
    gc.freeze()  # what start-up made lives for ever: full collections need not scan it again
    gc.set_threshold(GC_YOUNG, 10, 10)
    queues = ", ".join(sorted(config.queues))
    typer.echo(f"notifier {notifier.name} reading queues {queues}")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not stop.wait(0.5) and not notifier.failed.is_set():
            pass
    finally:
        typer.echo(f"notifier {notifier.name} stopping")
        notifier.stop()
        broker.connection.close()
    if notifier.failed.is_set():
        typer.echo(f"notifier {notifier.name} failed: {notifier.error}", err=True)
        raise typer.Exit(1)
