"""The broker's Redis connection as a long-running role sees it: is Redis there, and let go.

Why a store service: a role (the notifier) checks Redis answers before it starts its threads,
and closes the client's connections when it stops, without holding the client itself. It must
never hand the client out: everything else a role does in Redis is a named store service.
"""

from __future__ import annotations

from broker.store.handles import Store


class Connection:
    def __init__(self, store: Store) -> None:
        self.store = store

    def ping(self) -> bool:
        """Whether Redis answers (a patient client waits out a restart first; an unreachable
        Redis raises the client's connection error)."""
        return bool(self.store.redis.ping())

    def close(self) -> None:
        """Close the client's connections (its pool makes new ones if it is used again)."""
        self.store.redis.close()
