"""The reading thread: new entries of every handler queue's stream through the `notifiers`
group (`broker.notifier_reads`), a sweep for abandoned ones now and then, and parking while full.

It never stops on an error: Redis trouble is waited out with back-off, a deleted group is
made again, and a bug leaves what was read pending in the group, to be reclaimed later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis.exceptions import RedisError, ResponseError

from broker.facade import Broker, GroupMissing
from notifiers.inflight import Inflight
from notifiers.options import NotifierOptions
from notifiers.parker import Parker
from notifiers.reclaim import Reclaimer
from notifiers.router import Router

log = logging.getLogger("notifiers")
POLL_MS = 50
"""On a cluster, the pause after a round of reads that found nothing (no read blocks there)."""
QUIET_S = 1.0
"""With nothing to deliver (`Router.quiet`), the pause after a read that left nothing behind:
the entries are only acknowledged, so they are read in batches, not one wake-up each."""


class StreamReader:
    def __init__(
        self,
        broker: Broker,
        consumer: str,
        options: NotifierOptions,
        inflight: Inflight,
        router: Router,
        reclaimer: Reclaimer,
        parker: Parker,
        ensure_groups: Callable[[], None],
    ) -> None:
        self.consumer = consumer
        self.options = options
        self.inflight = inflight
        self.router = router
        self.reclaimer = reclaimer
        self.parker = parker
        self.ensure_groups = ensure_groups
        self.feed = broker.notifier_reads.feed(router.streams)
        self._idle = threading.Event()  # set when stopping: the pauses between polls end

    def loop(self, stopping: threading.Event) -> None:
        self._idle = stopping
        claim_every = max(0.05, min(self.options.claim_idle_s / 2, 5.0))
        next_claim = 0.0
        backoff = 0.1
        while not stopping.is_set():
            try:
                if time.monotonic() >= next_claim:
                    self.reclaimer.claim_stale()
                    next_claim = time.monotonic() + claim_every
                if not self.read_once():
                    self.parker.park_old()
                backoff = 0.1
                continue
            except GroupMissing:  # the stream or group was deleted under us
                self._make_groups()
            except ResponseError:
                log.exception("notifier %s: Redis refused a command", self.consumer)
            except RedisError:
                log.warning(
                    "notifier %s: Redis unavailable; retrying", self.consumer, exc_info=True
                )
            except Exception:  # a bug: what we read stays pending and is reclaimed later
                log.exception("notifier %s: reading failed; going on", self.consumer)
            stopping.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def read_once(self) -> bool:
        """Read and route one batch of new entries; False when there was no room to read."""
        room = self.inflight.room()
        if room <= 0:
            return False
        count = min(self.options.batch, room)
        pause = 0.0
        if self.router.quiet:  # nothing to deliver: no blocking read, a batch now and then
            got = self.feed.read(self.consumer, count, None)
            if sum(len(entries) for _, entries in got) < count:
                pause = QUIET_S
        else:
            # one Redis (or one partition): one blocking read of every stream; a cluster: one
            # read per partition (a read spans one slot), none blocking, so the pause between
            # polls is ours
            got = self.feed.read(self.consumer, count, self.options.block_ms)
            if not got and not self.feed.blocks:
                pause = min(self.options.block_ms or 0, POLL_MS) / 1000
        for stream, entries in got:
            self.router.handle(stream, entries, claimed=False)
        if pause:  # after what was read is on its way
            self._idle.wait(pause)
        return True

    def _make_groups(self) -> None:
        try:
            self.ensure_groups()
        except RedisError:
            log.warning("notifier %s: cannot make the group yet", self.consumer, exc_info=True)
