"""Taking over what dead consumers left: entries read by the group and never acknowledged.

XAUTOCLAIM hands us entries idle longer than `claim_idle_s`. An entry handed out too often
(a poison entry that kills its consumers) is dead-lettered instead of delivered, and entries
trimmed or deleted from the stream before anyone delivered them are recorded as lost.
"""

from __future__ import annotations

import threading
from typing import Any

from broker.facade import Broker
from broker.redis.replies import as_str as text
from broker.redis.replies import as_str_dict as decode_fields
from broker.store.keys import NOTIFIER_GROUP
from notifiers.dead_letters import DeadLetters
from notifiers.inflight import Inflight
from notifiers.options import NotifierOptions
from notifiers.router import RawEntry, Router

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
        self.redis = broker.redis
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
            cursor: Any = "0-0"
            for _ in range(SWEEP_ROUNDS):
                room = self.inflight.room()
                if room <= 0 or self.stopping.is_set():
                    return taken
                reply = self.redis.xautoclaim(
                    stream,
                    NOTIFIER_GROUP,
                    self.consumer,
                    idle_ms,
                    cursor,
                    count=min(self.options.batch, room),
                )
                cursor, claimed = reply[0], reply[1]
                if len(reply) > 2 and reply[2]:  # Redis 7: deleted ones, already out of the PEL
                    self.dead_letters.trimmed(stream, [text(i) for i in reply[2]], ack=False)
                live = [(eid, f) for eid, f in claimed if eid is not None and f is not None]
                if len(live) < len(claimed):  # Redis 6.2 returns deleted entries as nil
                    self._drop_deleted(stream)
                live = [e for e in live if (stream, text(e[0])) not in self.inflight]
                if live:
                    taken += len(live)
                    self.router.handle(stream, self._over_delivered(stream, live), claimed=True)
                if text(cursor) == "0-0":
                    break
        return taken

    def _over_delivered(self, stream: str, entries: list[RawEntry]) -> list[RawEntry]:
        """Dead-letter entries handed out too often; return the others."""
        pipe = self.redis.pipeline(transaction=False)
        for eid, _ in entries:
            pipe.xpending_range(stream, NOTIFIER_GROUP, eid, eid, 1)
        keep: list[RawEntry] = []
        for (eid, raw), info in zip(entries, pipe.execute(), strict=True):
            times = int(info[0]["times_delivered"]) if info else 0
            if times > self.options.max_deliveries:
                self.dead_letters.entry(
                    stream,
                    text(eid),
                    decode_fields(raw),
                    f"handed out {times} times and never acknowledged (does it crash notifiers?)",
                )
            else:
                keep.append((eid, raw))
        return keep

    def _drop_deleted(self, stream: str) -> None:
        """Dead-letter and acknowledge entries we own that were trimmed or deleted unread."""
        rows = self.redis.xpending_range(
            stream,
            NOTIFIER_GROUP,
            "-",
            "+",
            self.options.max_inflight + self.options.batch + 100,
            consumername=self.consumer,
        )
        ids = [text(r["message_id"]) for r in rows]
        ids = [i for i in ids if (stream, i) not in self.inflight]
        if not ids:
            return
        pipe = self.redis.pipeline(transaction=False)
        for i in ids:
            pipe.xrange(stream, i, i)
        gone = [i for i, found in zip(ids, pipe.execute(), strict=True) if not found]
        if gone:
            self.dead_letters.trimmed(stream, gone, ack=True)
