"""One-time markers (`once`): a reply that must count once (a Slack signature, a webhook id, a
Telegram update, an email link's nonce, a Teams activity) spends a marker, kept for a while.

A channel names its marker by kind and id (`marker`) and hands it to the decision, which spends it
in the same atomic step (decide.lua): a replay is refused, and a reply that failed half-way may be
tried again. A reply that decides nothing (opening a dialog) spends it here (`spend`); `spent`
answers before any work is done. The key names live in `broker.store.keys` (`Keys.seen`); this
module is the only one outside the Lua steps that reads or writes them. It never decides
anything: who may decide is the judge's.
"""

from __future__ import annotations

from broker.store.decide_step import Once
from broker.store.handles import Store

__all__ = ["Once", "OnceMarkers"]


class OnceMarkers:
    """Make, check and spend one-time markers (`broker.once` on the facade)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def marker(self, kind: str, ident: str, ttl_s: int, *, request_id: str | None = None) -> Once:
        """The marker of `ident` in `kind`'s namespace, kept `ttl_s` seconds once spent.

        With `request_id`, it is named in that request's partition (a Redis Cluster), where the
        decide step spends it, so `spent` reads the very key the step writes; without, the step
        moves it there itself."""
        keys = self.store.keys
        key = keys.seen(kind, ident)
        if request_id is not None:
            key = keys.in_partition(key, keys.partition_of_request(request_id))
        return key, int(ttl_s)

    def spent(self, once: Once) -> bool:
        """Whether the marker was spent already (a replay)."""
        return bool(self.store.redis.exists(once[0]))

    def spend(self, once: Once) -> None:
        """Spend the marker now (for a reply that records no decision)."""
        key, ttl_s = once
        self.store.redis.set(key, "1", ex=ttl_s)
