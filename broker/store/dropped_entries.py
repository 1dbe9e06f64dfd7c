"""Stream entries no notifier will deliver: counted (`failed:entry`) and taken out of the group.

Why a store service: the notifier's dead letters (`notifiers.dead_letters`) say why an entry is
given up (malformed, its request gone, handed out too often, trimmed unread) and write the
letter; taking the entry out of the `notifiers` group and counting it is the store's, in one
pipeline. It must never be called before the entry's dead letter is written (an entry dropped
without one is lost without a trace), and never drops an entry it was not given.
"""

from __future__ import annotations

from broker.store.handles import Store
from broker.store.keys import NOTIFIER_GROUP


class DroppedEntries:
    def __init__(self, store: Store) -> None:
        self.store = store

    def drop(self, stream: str, ids: list[str], *, ack: bool = True) -> None:
        """Count `ids` as failed entries and acknowledge them (`ack=False`: Redis already took
        them out of the group, as XAUTOCLAIM does with deleted ones)."""
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.hincrby(self.store.keys.stats, "failed:entry", len(ids))
        if ack:
            pipe.xack(stream, NOTIFIER_GROUP, *ids)
        pipe.execute()
