"""Sweeping: turning silence into an outcome, on Redis's clock.

A sweep is two Lua steps. due.lua lists the ids whose expiry has come (and forgets index
entries past the retention); sweep.lua then escalates each to its queue's `escalate_to` or times
it out, with the keys of exactly those requests in KEYS. Between the two steps anything may
happen to a listed request (a decision, another sweeper, an escalation): sweep.lua checks each
again, inside its atomic step, and touches only one still pending and still due. So any number
of sweepers can run at once without handling a request twice.

Both steps read Redis's clock (TIME), not the caller's: a sweeper host whose clock is off
neither expires early nor late. An explicit `now` overrides it (tests simulating the future).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from redis.cluster import RedisCluster

from broker.domain.ids import run_of_request
from broker.store.handles import Store
from broker.store.keys import Keys

log = logging.getLogger("broker.store.sweeping")

TIMED_OUT_REASON = "No one answered within %s seconds."
_TRIES = 5


@dataclass(frozen=True)
class SweepResult:
    """What the sweeper did to one due request."""

    request_id: str
    action: str  # "escalated" | "timed_out"
    from_queue: str
    to_queue: str | None


@dataclass(frozen=True)
class SweepBatch:
    """One sweep: what was done, and how many requests were listed as due for it.

    Fewer results than listed means others got there first; only a short listing means
    nothing more is due.
    """

    results: list[SweepResult]
    listed: int


class Sweeping:
    def __init__(self, store: Store) -> None:
        self.store = store

    def sweep(self, *, now: float | None = None, limit: int = 200) -> list[SweepResult]:
        """Escalate or time out up to `limit` due requests (due at `now` if given)."""
        return self.sweep_batch(now=now, limit=limit).results

    def sweep_batch(self, *, now: float | None = None, limit: int = 200) -> SweepBatch:
        """`sweep`, also saying how many were listed (a full listing: sweep again)."""
        store = self.store
        clock: dict[str, Any] = {} if now is None else {"now": now}
        results: list[SweepResult] = []
        listed = 0
        for keys in store.keys.parts():  # one partition, one slot, per pair of steps
            due = store.scripts.run(
                "due", keys.due_keys(), limit=limit, retention=store.retention, **clock
            )
            listed += len(due)
            results += self._handle(keys, due, clock) if due else []
        # a partition that listed `limit` makes `listed` >= limit: the sweeper sweeps again
        return SweepBatch(results, listed)

    def _handle(self, keys: Keys, due: list[str], clock: dict[str, Any]) -> list[SweepResult]:
        store = self.store
        routes = {
            name: {"to": q.escalate_to or False, "timeout": q.timeout_s, "quorum": q.quorum}
            for name, q in store.config.queues.items()
        }
        # The run keys of each request come from its id; the streams are every configured
        # queue's. A request whose stored run or queue is not among them is left untouched by
        # the step and named back (need_run / need_stream): we call again for it with that key.
        runs: dict[str, str | None] = {rid: run_of_request(rid) for rid in due}
        extra: list[str] = []
        done: list[SweepResult] = []
        for _ in range(_TRIES):
            step_keys = keys.sweep_keys(runs.items(), [*store.config.queues, *extra])
            flat = store.scripts.run(
                "sweep",
                step_keys,
                items=[{"id": rid, **({"run": run} if run else {})} for rid, run in runs.items()],
                routes=routes,
                reason=TIMED_OUT_REASON,
                maxlen=store.maxlen,
                retention=store.retention,
                **clock,
            )
            again: dict[str, str | None] = {}
            for i in range(0, len(flat), 4):
                rid, action, name, to = flat[i : i + 4]
                if action == "need_stream":
                    extra.append(name)
                    again[rid] = runs[rid]
                elif action == "need_run" and keys.partition_of_run(name) == keys.at:
                    again[rid] = name
                elif action == "need_run":  # a run in another slot: not one step here
                    log.warning("sweep: %s names run %s of another partition", rid, name)
                else:
                    done.append(SweepResult(rid, action, name, to or None))
            if not again:
                return done
            runs = again
        log.warning("sweep: %d due request(s) left for the next sweep: %s", len(runs), list(runs))
        return done

    def next_due_in(self) -> float | None:
        """Seconds until the earliest pending request expires (negative if overdue), or None;
        on Redis's clock, like the sweep itself."""
        redis = self.store.redis
        firsts = [redis.zrange(k.expiry, 0, 0, withscores=True) for k in self.store.keys.parts()]
        scores = [float(first[0][1]) for first in firsts if first]
        if not scores:
            return None
        seconds, micros = redis.time() if not self.store.clustered else _clock(self.store)
        return min(scores) - (seconds + micros / 1e6)


def _clock(store: Store) -> tuple[int, int]:
    """Redis's clock on a cluster: the TIME of the node holding the first partition."""
    cluster = store.redis
    if not isinstance(cluster, RedisCluster):
        raise TypeError(f"a cluster's clock needs a cluster client, not {type(cluster).__name__}")
    node = cluster.get_node_from_key(store.keys.part(0).expiry)
    seconds, micros = node.redis_connection.time()
    return int(seconds), int(micros)
