"""Taking over what dead consumers left: entries read by the group and never acknowledged.

XAUTOCLAIM (`broker.notifier_claims`) hands us entries idle longer than `claim_idle_s`. An entry
handed out too often (a poison entry that kills its consumers) is dead-lettered instead of
delivered, and entries trimmed or deleted from the stream before anyone delivered them are
recorded as lost.
"""

from __future__ import annotations

import threading

from broker.facade import Broker
from notifiers.dead_letters import DeadLetters
from notifiers.inflight import Inflight
from notifiers.options import NotifierOptions
from notifiers.router import Entry, Router

SWEEP_ROUNDS = 100  # XAUTOCLAIM calls per stream and sweep; the cursor resumes next time


class Reclaimer:
    def __init__(
        self,
        broker: Broker,
        consumer: str,
        options: NotifierOptions,
        inflight: Inflight,
        router: Router,
        dead_letters: DeadLetters,
        stopping: threading.Event,
    ) -> None:
        self.broker = broker
        self.claims = broker.notifier_claims
        self.consumer = consumer
        self.options = options
        self.inflight = inflight
        self.router = router
        self.dead_letters = dead_letters
        self.stopping = stopping

    def claim_stale(self) -> int:
        """Take over entries that a dead consumer read and never acknowledged (XAUTOCLAIM)."""
        idle_ms = int(self.options.claim_idle_s * 1000)
        taken = 0
        for stream in self.router.streams:
            cursor = "0-0"
            for _ in range(SWEEP_ROUNDS):
                room = self.inflight.room()
                if room <= 0 or self.stopping.is_set():
                    return taken
                count = min(self.options.batch, room)
                claimed = self.claims.take_over(stream, self.consumer, idle_ms, cursor, count)
                cursor = claimed.cursor
                if claimed.deleted:  # Redis 7: deleted ones, already out of the group
                    self.dead_letters.trimmed(stream, claimed.deleted, ack=False)
                if claimed.lost_some:  # Redis 6.2 returns deleted entries as nil
                    self._drop_deleted(stream)
                live = [e for e in claimed.entries if (stream, e[0]) not in self.inflight]
                if live:
                    taken += len(live)
                    self.router.handle(stream, self._over_delivered(stream, live), claimed=True)
                if claimed.done:
                    break
        return taken

    def _over_delivered(self, stream: str, entries: list[Entry]) -> list[Entry]:
        """Dead-letter entries handed out too often; return the others."""
        times = self.claims.times_delivered(stream, [eid for eid, _ in entries])
        keep: list[Entry] = []
        for (eid, fields), handed_out in zip(entries, times, strict=True):
            if handed_out > self.options.max_deliveries:
                self.dead_letters.entry(
                    stream,
                    eid,
                    fields,
                    f"handed out {handed_out} times and never acknowledged"
                    " (does it crash notifiers?)",
                )
            else:
                keep.append((eid, fields))
        return keep

    def _drop_deleted(self, stream: str) -> None:
        """Dead-letter and acknowledge entries we own that were trimmed or deleted unread."""
        count = self.options.max_inflight + self.options.batch + 100
        ids = self.claims.pending_of(stream, self.consumer, count)
        ids = [i for i in ids if (stream, i) not in self.inflight]
        if not ids:
            return
        gone = self.claims.gone_of(stream, ids)
        if gone:
            self.dead_letters.trimmed(stream, gone, ack=True)
