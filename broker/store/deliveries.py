"""Per-request delivery state in Redis, shared by every notifier process.

`keys.delivery(id)` holds, per channel, the Slack message that was posted (so a redelivered
event updates it instead of posting again) and `done:` markers for deliveries that succeeded
(so a redelivered entry skips them). `keys.disabled` lists endpoints switched off.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import WatchError

from broker.domain.models import utcnow
from broker.redis.replies import as_str
from broker.store.handles import Store


@dataclass(frozen=True)
class PostState:
    """A channel's message for a request: posted (channel, ts), being posted (claim), or none."""

    channel: str | None = None
    ts: str | None = None
    claimed_by: str | None = None
    claimed_at: float | None = None

    @property
    def posted(self) -> bool:
        return self.ts is not None

    @classmethod
    def parse(cls, raw: bytes | str | None) -> PostState:
        if not raw:
            return cls()
        try:
            data: Any = json.loads(raw)
        except ValueError:
            return cls()
        if not isinstance(data, dict):
            return cls()
        return cls(
            channel=data.get("channel"),
            ts=data.get("ts"),
            claimed_by=data.get("claimed_by"),
            claimed_at=data.get("claimed_at"),
        )


class DeliveryState:
    """What the notifiers keep of each request's deliveries (see the module's docstring)."""

    def __init__(self, store: Store) -> None:
        self.redis = store.redis
        self.keys = store.keys

    # ---- done markers ------------------------------------------------------------------

    def mark_done(self, request_id: str, field: str) -> None:
        self.redis.hset(self.keys.delivery(request_id), field, "1")

    def is_done(self, request_id: str, field: str) -> bool:
        return bool(self.redis.hexists(self.keys.delivery(request_id), field))

    def done_fields(self, request_ids: set[str]) -> dict[str, set[str]]:
        """Each request's delivery fields (its done markers among them: which (event, channel)
        pairs already went out), in one pipeline; none asked, no round trip."""
        if not request_ids:
            return {}
        order = list(request_ids)
        pipe = self.redis.pipeline(transaction=False)
        for rid in order:
            pipe.hkeys(self.keys.delivery(rid))
        return {
            rid: {as_str(k) for k in keys} for rid, keys in zip(order, pipe.execute(), strict=True)
        }

    # ---- posted messages (Slack) -------------------------------------------------------

    def post_state(self, request_id: str, field: str) -> PostState:
        return PostState.parse(self.redis.hget(self.keys.delivery(request_id), field))

    def claim_post(
        self, request_id: str, field: str, claimant: str, stale_after_s: float
    ) -> tuple[bool, PostState]:
        """Take the right to post the message, unless it is posted or someone else's live claim
        exists.

        `claimant` must be unique per delivery (two threads of one process are rivals too); a
        delivery retrying after an unclear failure passes the same one and gets its claim back,
        stamped afresh. A claim older than `stale_after_s` belonged to a consumer that died
        mid-post, and is taken over. Returns (claimed, state as found): a claim found and taken
        (`found.claimed_at` set) means a post may already be out.
        """
        key = self.keys.delivery(request_id)
        with self.redis.pipeline(transaction=True) as pipe:  # a cluster MULTI too
            while True:
                try:
                    pipe.watch(key)
                    found = PostState.parse(pipe.hget(key, field))
                    if found.posted:
                        pipe.unwatch()
                        return False, found
                    fresh = (
                        found.claimed_at is not None
                        and found.claimed_by != claimant
                        and time.time() - found.claimed_at < stale_after_s
                    )
                    if fresh:
                        pipe.unwatch()
                        return False, found
                    pipe.multi()
                    claim = {"claimed_by": claimant, "claimed_at": time.time()}
                    pipe.hset(key, field, json.dumps(claim))
                    pipe.execute()
                    return True, found
                except WatchError:
                    continue

    def record_post(self, request_id: str, field: str, channel: str, ts: str) -> None:
        self.redis.hset(
            self.keys.delivery(request_id), field, json.dumps({"channel": channel, "ts": ts})
        )

    def release_claim(self, request_id: str, field: str, claimant: str) -> None:
        """Drop our claim after a failed post so another attempt may post (ours or anyone's)."""
        key = self.keys.delivery(request_id)
        with self.redis.pipeline(transaction=True) as pipe:  # a cluster MULTI too
            try:
                pipe.watch(key)
                found = PostState.parse(pipe.hget(key, field))
                if found.posted or found.claimed_by != claimant:
                    pipe.unwatch()
                    return
                pipe.multi()
                pipe.hdel(key, field)
                pipe.execute()
            except WatchError:
                pass

    # ---- disabled endpoints ------------------------------------------------------------

    def disabled_reason(self, channel: str) -> str | None:
        raw = self.redis.hget(self.keys.disabled, channel)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return f"{data['reason']} (since {data['at']})"
        except (ValueError, KeyError, TypeError):
            return as_str(raw)

    def disable(self, channel: str, reason: str) -> None:
        record = json.dumps({"reason": reason, "at": utcnow().isoformat()})
        self.redis.hsetnx(self.keys.disabled, channel, record)

    def enable(self, channel: str) -> bool:
        return bool(self.redis.hdel(self.keys.disabled, channel))
