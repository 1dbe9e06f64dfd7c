"""Reading the insights rollups of a window: the day and hour hashes the Lua steps keep.

Why its cost is flat: a window is read as whole UTC days from the day hashes (`Keys.insights`)
and its partial days from the hour hashes (`Keys.insights_hours`, fields headed by `HH`), one
pipelined HGETALL each per partition, so a call costs as many hashes as the window has days (at
most 366 + 2) and as many fields as there are distinct cells and tools in them, whatever the
number of requests. Summing the counters and judging who sees what is `broker.domain.insights`.
Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from redis.cluster import RedisCluster

from broker.domain.insights import HOUR_S, US, Counter, hours_of, parse_counter
from broker.redis.replies import as_str
from broker.store.handles import Store

_DAY_H = 24


class Insights:
    """The rollups of a window, summed over every partition."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def now(self) -> datetime:
        """Redis's clock (the rollups' hours are on it); the host's on a cluster."""
        if isinstance(self.store.redis, RedisCluster):
            return datetime.now(UTC)
        seconds, micros = self.store.redis.time()
        return datetime.fromtimestamp(int(seconds) + int(micros) / 1e6, UTC)

    def counters(
        self, since: datetime, until: datetime
    ) -> tuple[list[tuple[Counter, int]], datetime, datetime]:
        """The counters of the whole hours from `since` (down to the hour) to `until` (up to
        the hour), and those hours' bounds: what the figures really cover."""
        first, last = hours_of(since, until)
        plan = list(_plan(first, last))
        pipe = self.store.redis.pipeline(transaction=False)
        for keys in self.store.keys.parts():
            for day, hours in plan:
                pipe.hgetall(keys.insights(day) if hours is None else keys.insights_hours(day))
        replies = pipe.execute()
        totals: dict[str, int] = {}
        per_part = len(plan)
        for i, raw in enumerate(replies):
            _, hours = plan[i % per_part]
            for name, value in raw.items():
                field = as_str(name)
                if field.startswith("#"):
                    continue  # the day's own bookkeeping (the count of distinct reasons)
                if hours is not None:
                    head, _, field = field.partition(US)
                    if head not in hours:
                        continue
                totals[field] = totals.get(field, 0) + int(value)
        out = []
        for field, n in totals.items():
            counter = parse_counter(field)
            if counter is not None and n:
                out.append((counter, n))
        start = datetime.fromtimestamp(first * HOUR_S, UTC)
        end = datetime.fromtimestamp(last * HOUR_S, UTC)
        return out, start, end


def _plan(first: int, last: int) -> Iterator[tuple[int, frozenset[str] | None]]:
    """Each day the hours [first, last) touch: None for a whole day (its day hash), else the
    hours (`HH`) to take from its hour hash."""
    for day in range(first // _DAY_H, (last - 1) // _DAY_H + 1):
        lo = max(first, day * _DAY_H)
        hi = min(last, (day + 1) * _DAY_H)
        if hi - lo == _DAY_H:
            yield day, None
        else:
            yield day, frozenset(f"{h - day * _DAY_H:02d}" for h in range(lo, hi))
