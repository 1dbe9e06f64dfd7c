"""The heartbeat thread: proof of life for what this notifier holds.

Our in-flight entries are re-claimed (`broker.notifier_claims.keep`: XCLAIM, idle reset) so no
other notifier takes them from a live us, and the leases of parked deliveries we work on are
pushed ahead. A notifier that dies stops beating, and both are taken over once `claim_idle_s`
passes.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

from redis.exceptions import RedisError

from broker.facade import Broker
from notifiers.dispatch import Dispatcher
from notifiers.inflight import Inflight
from notifiers.parking import ParkedStore

log = logging.getLogger("notifiers")


class Heartbeat:
    def __init__(
        self,
        broker: Broker,
        consumer: str,
        claim_idle_s: float,
        inflight: Inflight,
        dispatcher: Dispatcher,
        store: ParkedStore,
    ) -> None:
        self.claims = broker.notifier_claims
        self.consumer = consumer
        self.every = max(0.05, claim_idle_s / 3)
        self.inflight = inflight
        self.dispatcher = dispatcher
        self.store = store

    def loop(self, stopping: threading.Event) -> None:
        while not stopping.wait(self.every):
            for step in (self.claim_own, self.renew_leases):  # one failing skips not the other
                try:
                    step()
                except RedisError:
                    log.warning("notifier %s: heartbeat failed", self.consumer, exc_info=True)
                except Exception:
                    log.exception("notifier %s: heartbeat failed unexpectedly", self.consumer)

    def claim_own(self) -> None:
        by_stream: dict[str, list[str]] = defaultdict(list)
        for stream, entry_id in self.inflight.keys():
            by_stream[stream].append(entry_id)
        for stream, ids in by_stream.items():
            self.claims.keep(stream, self.consumer, ids)

    def renew_leases(self) -> None:
        held = self.dispatcher.held()
        if held:
            self.store.renew(held)
