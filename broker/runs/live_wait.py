"""Live waits on the fleet: the job that paused a run waits `live_wait_s` for the round's outcomes
and, when they all arrive in time, goes on in the same job (no resume job, no history reload).

Exactly once still holds because a completed round is *claimed* before anyone continues it:
`HSETNX run:{id} claimed:{round}` with `live` (the waiting job) or `resumer` (the outbox step).
The first writer owns the round; the other backs off: the resumer acknowledges the outbox entry
without enqueueing, the live job stops and leaves the round to the resume job. A live job that
dies after claiming is continued by its own retry (see `AgentRunner.advance`). While a live
job waits, its deadline is on the run (`live_until:{round}`), and the resumer's claim step
leaves a completed round nobody claimed alone until then (`broker/scripts/resume.lua`): the
waiting job is woken by the same outcome and claims it first; a job that died meanwhile costs
the round at most the rest of its wait.

The wait reads the handler queues' streams (XREAD BLOCK), where every outcome is announced in
the same atomic step that records it; it checks the round's pending set after fixing its stream
positions, so an outcome can't slip between the check and the read. A round's requests live in
their run's partition (`Keys.of_run`), so the wait reads that partition's streams only: one
slot, one blocking XREAD, on a single Redis and on a Redis Cluster alike.
"""

from __future__ import annotations

import time

from redis.typing import KeyT, StreamIdT

from broker.facade import Broker
from broker.redis.replies import as_str, as_streams

LIVE = "live"
RESUMER = "resumer"
BLOCK_S = 1.0
"""Longest single XREAD BLOCK, well below any socket timeout."""


def claim_field(round_no: int) -> str:
    return f"claimed:{round_no}"


def live_field(round_no: int) -> str:
    """Until when (epoch seconds) a live job waits for the round: the resumer's claim step
    leaves a completed round nobody claimed alone until then, so the waiting job gets to go on
    with it (it only needs its claim; the resumer, woken by the same outcome, might win)."""
    return f"live_until:{round_no}"


def claim(broker: Broker, run_id: str, round_no: int, who: str) -> bool:
    """Claim round `round_no` of the run for `who`; True if it is (now or already) `who`'s."""
    key, field = broker.keys.run(run_id), claim_field(round_no)
    pipe = broker.redis.pipeline()
    pipe.hsetnx(key, field, who)
    pipe.hget(key, field)
    _, owner = pipe.execute()
    return owner is not None and owner.decode() == who


def owned_round(fields: dict[str, str], round_no: int) -> int:
    """The round a job for `round_no` is really on: later rounds it went on with live count."""
    current = int(fields.get("round") or 0)
    while round_no < current and fields.get(claim_field(round_no + 1)) == LIVE:
        round_no += 1
    return round_no


def claimed_by(broker: Broker, run_id: str, round_no: int) -> str | None:
    owner = broker.redis.hget(broker.keys.run(run_id), claim_field(round_no))
    return as_str(owner)


def wait_round(broker: Broker, run_id: str, round_no: int, timeout_s: float) -> bool:
    """Block until every call of the run's round has an outcome; False after `timeout_s`.

    The pending set is checked again only when an event names one of the round's requests.
    """
    mine_keys = broker.keys.of_run(run_id)  # the round's requests announce there
    streams = [mine_keys.stream(q) for q in broker.config.queues]
    pipe = broker.redis.pipeline(transaction=False)
    pipe.hset(broker.keys.run(run_id), live_field(round_no), f"{time.time() + timeout_s:.6f}")
    for stream in streams:
        pipe.xrevrange(stream, count=1)
    pipe.lrange(broker.keys.run_round(run_id, round_no), 0, -1)
    _, *newest, ids = pipe.execute()
    positions: dict[KeyT, StreamIdT] = {
        s: rows[0][0] if rows else b"0-0" for s, rows in zip(streams, newest, strict=True)
    }
    mine = set(ids)
    pending = broker.keys.run_pending(run_id)
    deadline = time.monotonic() + timeout_s
    check = True
    while True:
        if check and broker.redis.scard(pending) == 0:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        block_ms = max(1, int(min(left, BLOCK_S) * 1000))
        check = False
        got = as_streams(broker.redis.xread(positions, count=500, block=block_ms))
        for name, entries in got:
            positions[name.decode()] = entries[-1][0]
            check = check or any(f.get(b"request_id") in mine for _, f in entries)


def wait_and_claim(broker: Broker, run_id: str, round_no: int, timeout_s: float) -> bool:
    """True when the round completed within `timeout_s` and this live job owns it now."""
    return wait_round(broker, run_id, round_no, timeout_s) and claim(broker, run_id, round_no, LIVE)
