"""One notifier process's consumer: the parts wired together, started and stopped as one.

Threads: the reader (notifiers.reader: new entries, reclaimed ones, parking while full); the
heartbeat (notifiers.heartbeat); the parked-delivery poller (notifiers.parker); the
dispatcher's per-channel pools and timer (notifiers.dispatch); the committer
(notifiers.commit). Entries are at-least-once: a crash between delivering and acknowledging
means a redelivery, which the `done:` markers and the remembered Slack messages make harmless.

When `max_inflight` entries are in flight and some have waited longer than `park_after_s` (a
hung or failing channel), their unfinished deliveries are parked in Redis (notifiers.parking)
and the entries acknowledged, so the healthy channels keep flowing.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from broker.facade import Broker
from channels.sender import Sender
from notifiers.commit import Committer
from notifiers.dead_letters import DeadLetters
from notifiers.dispatch import Dispatcher
from notifiers.heartbeat import Heartbeat
from notifiers.inflight import Inflight
from notifiers.options import NotifierOptions
from notifiers.parker import Parker
from notifiers.parking import ParkedStore
from notifiers.reader import StreamReader
from notifiers.reclaim import Reclaimer
from notifiers.router import Router


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Notifier:
    """One notifier process's worth of consumers; `start()` it, `stop()` it.

    `failed` is set (and the notifier stops) when its bookkeeping broke; `run_notifier` then
    exits non-zero so a supervisor restarts it, and its entries are reclaimed by others.
    """

    def __init__(
        self,
        broker: Broker,
        channels: dict[str, Sender],
        options: NotifierOptions | None = None,
        *,
        name: str | None = None,
    ) -> None:
        self.broker = broker
        self.options = options or NotifierOptions()
        self.name = name or self.options.name or default_name()
        self.channels = channels
        self.failed = threading.Event()
        self.error: str | None = None
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        opts = self.options
        streams = broker.notifier_reads.streams(broker.config.queues)
        self.inflight = Inflight(opts.max_inflight)
        self.store = ParkedStore(broker, lease_s=opts.claim_idle_s)
        self.dead_letters = DeadLetters(broker, self.name)
        self.committer = Committer(broker, self.inflight.done, self.store, self.fail)
        report = self.committer.put
        self.dispatcher = Dispatcher(channels, report, self.dead_letters.task, self.store)
        self.router = Router(
            broker, channels, streams, self.inflight, self.dispatcher, report, self.dead_letters
        )
        self.parker = Parker(
            channels,
            opts.park_after_s,
            self.inflight,
            self.dispatcher,
            self.store,
            report,
            self.router.fetch,
            self.dead_letters,
        )
        reclaimer = Reclaimer(
            broker, self.name, opts, self.inflight, self.router, self.dead_letters, self._stopping
        )
        self.reader = StreamReader(
            broker,
            self.name,
            opts,
            self.inflight,
            self.router,
            reclaimer,
            self.parker,
            self.ensure_groups,
        )
        self.heartbeat = Heartbeat(
            broker, self.name, opts.claim_idle_s, self.inflight, self.dispatcher, self.store
        )

    def start(self) -> Notifier:
        self.ensure_groups()
        loops: list[tuple[Callable[[threading.Event], None], str]] = [
            (self.reader.loop, "notify-read"),
            (self.heartbeat.loop, "notify-beat"),
            (self.parker.loop, "notify-parked"),
        ]
        for target, name in loops:
            thread = threading.Thread(target=target, args=(self._stopping,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, grace_s: float | None = None) -> None:
        """Stop reading, give deliveries in flight `grace_s` to finish, then shut down.

        Whatever is unfinished stays pending in the group (or parked) and another notifier
        takes it over.
        """
        grace = self.options.shutdown_grace_s if grace_s is None else grace_s
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.inflight.wait_empty(time.monotonic() + grace, self.failed)
        self.dispatcher.close()
        self.committer.close()
        self.router.close()
        for channel in self.channels.values():
            channel.close()

    def fail(self, error: str) -> None:
        """Stop taking work: this notifier can no longer keep its books."""
        self.error = error
        self.failed.set()
        self._stopping.set()
        self.inflight.wake()

    def ensure_groups(self) -> None:
        self.broker.notifier_reads.ensure_groups(self.router.streams)
