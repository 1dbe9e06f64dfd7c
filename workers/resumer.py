"""The `approval-broker resumer` role: moves fully answered rounds from the outbox onto RQ.

The exactly-once logic lives in `broker.runs.outbox.Resumer`; this module only runs it until stopped.
"""

from __future__ import annotations

import gc
import signal
import threading

from broker.domain.config import Config
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.runs.outbox import Resumer

__all__ = ["Resumer", "run_resumer"]


def run_resumer(settings: Settings, config: Config, *, stop: threading.Event | None = None) -> None:
    """The `approval-broker resumer` role: runs until SIGINT/SIGTERM (or `stop` is set)."""
    broker = Broker.from_settings(settings, config, patient=True)
    stop = stop or threading.Event()
    resumer = Resumer(broker)
    gc.freeze()  # start-up's objects live for ever: full collections need not scan them again
    print(f"resumer ready on {resumer.stream} as {resumer.consumer}", flush=True)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        resumer.run_forever(stop)
    except KeyboardInterrupt:
        pass
