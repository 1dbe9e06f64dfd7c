"""The broker's Redis client let go of, for a long-running role that stops.

Why a store service: a role (the notifier) closes the client's connections when it stops,
without holding the client itself (is Redis there: `broker.fleet.ping`). It must never hand the
client out: everything else a role does in Redis is a named store service.
"""

from __future__ import annotations

from broker.store.handles import Store


class Connection:
    def __init__(self, store: Store) -> None:
        self.store = store

    def close(self) -> None:
        """Close the client's connections (its pool makes new ones if it is used again)."""
        self.store.redis.close()
